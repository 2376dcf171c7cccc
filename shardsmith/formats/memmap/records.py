"""Memmap records (``encoder.py``'s layout) back into what the writer writes: each event's fixed
fields, its count, its kept length and its kept values, by a few numpy operations a batch.

The fixed fields are one gather of bytes each; the counts one of words; the kept values, which lie
whole in each record as ``(kept, F)`` rows, one slice per event joined (or, for events of fewer than
``RUN_BYTES`` of values, one gather of values), ready to land in the padded rows. Measured in the
gather of 200,000 IceCube-like events (``bench/ab_memmap.py``'s input; ``rows_of`` under cProfile):
events of 800 bytes of values 0.2 s by slices against 0.75 s by an index per value (whose 40 million
index entries cost more than the copy), of 240 bytes 0.2 against 0.5 s, of 80 bytes 0.67 against 0.23 s.
Before, the records held the events' own fields (``core.events``): decoding cut and gathered each
field apart, and the cast and the truncation were the writer's too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardsmith.core.events import pad8, record_starts
from shardsmith.core.ragged import RUN_BYTES, starts_of, take_ragged
from shardsmith.formats.memmap.shape import Layout


@dataclass(frozen=True, slots=True)
class Rows:
    """A batch of events as the memmap files take them: ``values`` are the ``(sum(lengths), F)`` kept
    values, event after event; ``counts`` each event's values before truncation, ``lengths`` after."""

    n: int
    scalars: dict[str, np.ndarray]
    counts: np.ndarray
    lengths: np.ndarray
    values: np.ndarray


def rows_of(lengths: np.ndarray, payload: np.ndarray | memoryview | bytes, layout: Layout, *,
            starts: np.ndarray | None = None) -> Rows:
    """The records (back to back, or at ``starts``); a record whose size is not what its count says
    is a ValueError (never a short or foreign row)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    back_to_back = starts is None
    raw, starts = record_starts(lengths, payload, starts)
    if back_to_back and n and np.any(starts % 8):  # then each record must be padded to 8 bytes
        raise ValueError(f"record positions outside the payload's {len(raw)} bytes or not 8-byte aligned")
    scalars: dict[str, np.ndarray] = {}
    at = 0
    for f in layout.scalars:
        b = f.item_bytes
        cells = raw[(starts + at)[:, None] + np.arange(b)] if b else np.zeros((n, 0), np.uint8)
        scalars[f.name] = cells.view(f.np_dtype).reshape(n, *f.shape)
        at += pad8(b)
    if n and int((starts + at + 8).max()) > len(raw):
        raise ValueError(f"records past the payload's {len(raw)} bytes")
    counts = raw[: len(raw) // 8 * 8].view("<i8")[(starts + at) // 8].astype(np.int64)
    kept = np.minimum(counts, layout.max_len)
    width = len(layout.features)
    nbytes = kept * (width * layout.dtype.itemsize)
    if n and (np.any(counts < 0) or np.any(at + 8 + pad8(nbytes) != lengths)):
        raise ValueError("records whose counts say another size than the records have")
    pos = starts + at + 8  # where each record's values begin (8-byte aligned)
    if int(nbytes.sum()) < RUN_BYTES * n:  # short runs: one index per value (not per byte, as take_ragged's)
        size = layout.dtype.itemsize
        items = kept * width
        index = np.repeat(pos // size - starts_of(items)[:-1], items) + np.arange(int(items.sum()), dtype=np.int64)
        values = raw[: len(raw) // size * size].view(layout.dtype)[index]
    else:
        values = take_ragged(raw, nbytes, np.arange(n, dtype=np.int64), starts=pos).view(layout.dtype)
    return Rows(n=n, scalars=scalars, counts=counts, lengths=kept, values=values.reshape(-1, width))
