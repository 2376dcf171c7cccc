"""Ragged event values into fixed ``(n, L, F)`` rows: truncation by the layout's policy and the cast
to the output dtype in the workers (``kept_rows``: the format's encoder, ``encoder.py``), padding with
``PAD_VALUE`` in the writer (``place_rows``). numpy only, no loop per event.

Each event's kept values are found as runs (first, last) or, for ``top``, by ranking only the
values of the events longer than L (the others keep everything); then one gather per field
fills a ``(k, F)`` block of the kept values, which lands in the rows with one assignment of
whole ``F``-value rows (a void view: one copy of 4-byte x F items, not F strided scatters).

Truncation: ``first``, ``last``, or ``top:FIELD`` (the L highest FIELD, NaN and -inf below every
number, ties to the earlier value; ranked only among the events longer than L, in groups of counts
up to the same power of two, one row sort per group); kept values stay in input order. Padding is
0.0: the lengths tell data from padding. Cast to ``--dtype``: an event with a finite value beyond its
range is a bad record (never a silent inf); NaN and ±inf are stored.
"""

from __future__ import annotations

import numpy as np

from shardsmith.core.events import EventChunk
from shardsmith.core.ragged import starts_of
from shardsmith.formats.memmap.shape import PAD_VALUE, Layout


def kept_values(offsets: np.ndarray, layout: Layout, key: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(index, lengths)``: the positions (in the flat values) of the values each event keeps, event by
    event in input order, and each event's kept count (at most L). ``key``: the ``top`` field's values."""
    counts = np.diff(offsets)
    lengths = np.minimum(counts, layout.max_len)
    long = counts > layout.max_len
    if not long.any():
        return np.arange(int(offsets[-1]), dtype=np.int64), lengths
    first = offsets[:-1] + (counts - lengths if layout.keep.how == "last" else 0)
    index = _runs(first, lengths)
    if layout.keep.how != "top":
        return index, lengths
    assert key is not None
    cut = np.flatnonzero(long)  # rank the values of the long events only, in groups of like counts
    top = np.empty(int(lengths[cut].sum()), dtype=np.int64)
    at = starts_of(lengths[cut])
    size = np.ceil(np.log2(counts[cut])).astype(np.int64)
    for width in np.unique(size).tolist():
        group = np.flatnonzero(size == width)
        top[_runs(at[group], lengths[cut][group])] = _top_of(offsets, cut[group], key, 1 << width, layout.max_len)
    index[_runs(starts_of(lengths)[:-1][cut], lengths[cut])] = top
    return index, lengths


def _top_of(offsets: np.ndarray, events: np.ndarray, key: np.ndarray, width: int, length: int) -> np.ndarray:
    """The flat positions of the ``length`` brightest values of each of ``events`` (counts at most
    ``width``), event by event in input order: one row per event, padded with places that rank last
    (a sort along rows: no sort of every value of the chunk at once)."""
    counts = offsets[events + 1] - offsets[events]
    rows = np.full((len(events), width), np.inf)
    place = _runs(np.arange(len(events), dtype=np.int64) * width, counts)
    source = _runs(offsets[events], counts)
    rows.reshape(-1)[place] = -np.nan_to_num(key[source].astype(np.float64), nan=-np.inf)  # NaN: after numbers
    best = np.sort(np.argsort(rows, axis=1, kind="stable")[:, :length], axis=1)  # stable: ties keep input order
    return (best + offsets[events][:, None]).reshape(-1)


def _runs(first: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``first[i] + arange(lengths[i])`` for every i, back to back."""
    total = int(lengths.sum())
    return np.repeat(first - starts_of(lengths)[:-1], lengths) + np.arange(total, dtype=np.int64)


def kept_rows(chunk: EventChunk, layout: Layout) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]:
    """``(values, lengths, refused)``: each event's kept values (at most L, by the layout's policy) as
    ``(k, F)`` rows of the layout's dtype, event after event; each event's kept count; and the events
    holding a finite value beyond the dtype's range (it would become inf), each with why (its first
    such value, in field order), which are bad records. NaN and inf are stored as they are."""
    offsets = chunk.offsets[layout.counter]
    key = chunk.columns[layout.keep.field] if layout.keep.field is not None else None
    index, lengths = kept_values(offsets, layout, key)
    width = len(layout.features)
    block = np.empty((len(index), width), layout.dtype)
    limit = float(np.finfo(layout.dtype).max)
    refused: dict[int, str] = {}
    for j, f in enumerate(layout.features):
        values = chunk.columns[f.name][index]
        if values.dtype.kind in "iuf" and values.dtype != layout.dtype:
            big = np.abs(values.astype(np.float64)) > limit  # NaN compares False; inf is allowed through
            big &= np.isfinite(values) if values.dtype.kind == "f" else True
            if big.any():
                at = np.flatnonzero(big)
                events, first = np.unique(np.repeat(np.arange(chunk.n), lengths)[at], return_index=True)
                for e, p in zip(events.tolist(), at[first].tolist()):
                    refused.setdefault(e, f"field {f.name!r}: value {values[p]} is beyond {layout.dtype.name}'s "
                                          f"range (±{limit:g}); use --dtype float32")
        with np.errstate(over="ignore"):  # only in the refused events' rows, which are never written
            block[:, j] = values
    return block, lengths, sorted(refused.items())


def place_rows(out: np.ndarray, values: np.ndarray, lengths: np.ndarray, layout: Layout) -> None:
    """Events' kept values (``kept_rows``' rows, event after event, ``lengths`` each) as padded rows
    of ``out`` (``(n, L, F)`` of the layout's dtype): one assignment of whole ``F``-value rows."""
    out[...] = PAD_VALUE
    if not len(values):
        return
    width = len(layout.features)
    dest = _runs(np.arange(len(lengths), dtype=np.int64) * layout.max_len, lengths)
    row = np.dtype((np.void, width * layout.dtype.itemsize))
    out.reshape(-1, width).view(row).reshape(-1)[dest] = np.ascontiguousarray(values).view(row).reshape(-1)
