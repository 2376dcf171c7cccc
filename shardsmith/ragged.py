"""Reordering ragged payloads (variable-length records stored back to back) without a loop per element."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shardsmith.memory import no_gc

# runs at least this long on average are copied one slice per run; shorter ones, one index per item
RUN_BYTES = 128


def join(pieces: Sequence[Any]) -> np.ndarray:
    """Buffers back to back as one new, writable, 8-byte aligned uint8 array (a join moves runs of
    hundreds of bytes several times faster than a numpy gather with one index per item)."""
    with no_gc():
        joined = bytearray().join(pieces)
    out = np.frombuffer(joined, dtype=np.uint8) if joined else np.zeros(0, dtype=np.uint8)
    return out if out.ctypes.data % 8 == 0 else out.copy()


def slices(view: memoryview, lo: np.ndarray, hi: np.ndarray) -> list[memoryview]:
    """``view[lo[i]:hi[i]]`` for every i (byte positions)."""
    with no_gc():
        return [view[a:b] for a, b in zip(lo.tolist(), hi.tolist())]


def starts_of(lengths: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums: where each record begins; one extra entry for the end."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return starts


def take_ragged(flat: np.ndarray, lengths: np.ndarray, order: np.ndarray, *,
                starts: np.ndarray | None = None) -> np.ndarray:
    """The records ``order`` of ``flat`` back to back (numpy fancy index for short records,
    slice copies for long ones, where an index per element would cost more than the data).
    Records lie back to back in ``flat``, or at ``starts`` (one per record, any order)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    picked = lengths[order]
    total = int(picked.sum())
    if len(order) == 0:
        return flat[:0]
    if starts is None:
        starts = starts_of(lengths)
        if len(order) == len(lengths) and np.all(order == np.arange(len(order))):
            return flat
    else:
        starts = np.asarray(starts, dtype=np.int64)
    if total <= 256 * len(order):
        out_starts = starts_of(picked)[:-1]
        index = np.arange(total, dtype=np.int64) + np.repeat(starts[order] - out_starts, picked)
        return flat[index]
    view = memoryview(np.ascontiguousarray(flat)).cast("B")
    size = flat.dtype.itemsize
    lo = starts[order] * size
    lo, hi = lo.tolist(), (lo + picked * size).tolist()
    joined = b"".join([view[a:b] for a, b in zip(lo, hi)])
    return np.frombuffer(joined, dtype=flat.dtype)
