"""Reordering ragged payloads (variable-length records stored back to back) without a loop per element."""

from __future__ import annotations

import numpy as np


def starts_of(lengths: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums: where each record begins; one extra entry for the end."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return starts


def take_ragged(flat: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The records ``order`` of ``flat`` back to back (numpy fancy index for short records,
    slice copies for long ones, where an index per element would cost more than the data)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    starts = starts_of(lengths)
    picked = lengths[order]
    total = int(picked.sum())
    if len(order) == 0:
        return flat[:0]
    if len(order) == len(lengths) and np.all(order == np.arange(len(order))):
        return flat
    if total <= 256 * len(order):
        out_starts = starts_of(picked)[:-1]
        index = np.arange(total, dtype=np.int64) + np.repeat(starts[order] - out_starts, picked)
        return flat[index]
    view = memoryview(np.ascontiguousarray(flat)).cast("B")
    size = flat.dtype.itemsize
    lo, hi = (starts[order] * size).tolist(), (starts[order + 1] * size).tolist()
    joined = b"".join([view[a:b] for a, b in zip(lo, hi)])
    return np.frombuffer(joined, dtype=flat.dtype)
