"""Ragged fields into model inputs, chosen at load time (the shards hold unpadded events).

``pad``: each ragged field becomes (B, L, *shape) with L the batch maximum or ``max_len``, plus a
bool mask (B, L) per counter. ``flat``: values stay back to back, with ``cu_seqlens`` (int32,
B + 1) and ``max_seqlen`` per counter, as FlashAttention's varlen kernels take them. One boolean
scatter (pad) or compress (truncation) per field; no loop over events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema
from shardsmith.core.ragged import starts_of
from shardsmith.kit.event_batch import EventBatch

RAGGED = ("pad", "flat")
TRUNCATE = ("tail", "head", "error")
RESERVED = ("mask", "cu_seqlens", "max_seqlen")


def collate_events(samples_or_batch: EventBatch | Sequence[dict[str, np.ndarray]], *, ragged: str = "pad",
                   max_len: int | None = None, truncate: str = "tail", pad_value: Any = 0,
                   schema: EventSchema | None = None) -> dict[str, Any]:
    """A batch as a dict of numpy arrays: fixed fields (B, *shape), ragged fields padded or flat.

    Extra keys: ``mask`` {counter: bool (B, L)} for ``pad``; ``cu_seqlens`` {counter: int32 (B+1)}
    and ``max_seqlen`` {counter: int} for ``flat``. ``max_len`` caps each event's length:
    ``truncate="tail"`` keeps its first ``max_len`` entries, ``"head"`` its last, ``"error"`` raises.
    With ``max_len``, ``pad`` always pads to exactly ``max_len`` (static shapes). A list of events
    (``ds[i]`` dicts) needs ``schema``.
    """
    if ragged not in RAGGED:
        raise ValueError(f"ragged={ragged!r}: choose one of {RAGGED}")
    if truncate not in TRUNCATE:
        raise ValueError(f"truncate={truncate!r}: choose one of {TRUNCATE}")
    if max_len is not None and max_len < 0:
        raise ValueError(f"max_len={max_len}: must not be negative")
    if isinstance(samples_or_batch, EventBatch):
        batch = samples_or_batch
    else:
        if schema is None:
            raise TypeError("collate_events of a list of events needs schema= (EventDataset.schema)")
        batch = EventBatch.from_samples(samples_or_batch, schema)
    clash = [name for name in RESERVED if name in batch.fixed or name in batch.ragged]
    if clash:
        raise ValueError(f"field names {clash} clash with the keys collate_events adds; rename those fields")
    out: dict[str, Any] = dict(batch.fixed)
    extra: dict[str, dict[str, Any]] = {key: {} for key in (("mask",) if ragged == "pad" else RESERVED[1:])}
    for counter in batch.schema.counters:
        offsets = batch.offsets(counter)
        counts = np.diff(offsets)
        keep, kept = _truncation(counter, offsets, counts, max_len, truncate)
        if ragged == "pad":
            width = max_len if max_len is not None else int(kept.max(initial=0))
            mask = np.arange(width) < kept[:, None]
            extra["mask"][counter] = mask
        else:
            extra["cu_seqlens"][counter] = starts_of(kept).astype(np.int32)
            extra["max_seqlen"][counter] = int(kept.max(initial=0))
        for f in batch.schema.members(counter):
            values = batch.ragged[f.name].values
            if keep is not None:
                values = values[keep]
            if ragged == "flat":
                out[f.name] = values
                continue
            if pad_value == 0:
                padded = np.zeros((len(counts), width, *f.shape), dtype=values.dtype)
            else:
                padded = np.full((len(counts), width, *f.shape), pad_value, dtype=values.dtype)
            padded[mask] = values
            out[f.name] = padded
    out.update(extra)
    return out


def _truncation(counter: str, offsets: np.ndarray, counts: np.ndarray, max_len: int | None,
                truncate: str) -> tuple[np.ndarray | None, np.ndarray]:
    """(which flat values to keep, or None for all; each event's kept length)."""
    if max_len is None or not len(counts) or counts.max() <= max_len:
        return None, counts
    if truncate == "error":
        k = int(np.argmax(counts > max_len))
        raise ValueError(f"event {k} of the batch has {int(counts[k])} {counter!r} entries, more than "
                         f"max_len={max_len} (truncate='error')")
    kept = np.minimum(counts, max_len)
    position = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
    # tail: keep positions [0, max_len); head: drop the first counts - kept
    keep = position < max_len if truncate == "tail" else position >= np.repeat(counts - kept, counts)
    return keep, kept
