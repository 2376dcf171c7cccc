"""Reordering ragged payloads (variable-length records stored back to back) without a loop per element."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from shardsmith.core.memory import no_gc

# runs at least this long on average are copied one slice per run; shorter ones, one index per item
RUN_BYTES = 128


def join(pieces: Iterable[Any]) -> np.ndarray:
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
    """The records ``order`` of ``flat`` back to back. ``lengths`` (and ``starts``) count rows of
    ``flat``'s first axis; records lie back to back, or at ``starts`` (one per record, any order).
    Records shorter than ``RUN_BYTES`` on average: one numpy index per row; longer: one slice each,
    joined (an index per row would cost more than the data). A record that runs past ``flat`` is a
    ValueError (or IndexError), never a short copy."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    if len(order) == 0:
        return flat[:0]
    picked = lengths[order]
    total = int(picked.sum())
    if starts is None:
        starts = starts_of(lengths)
        if len(order) == len(lengths) and np.all(order == np.arange(len(order))):
            return flat
    else:
        starts = np.asarray(starts, dtype=np.int64)
    row = flat.dtype.itemsize * int(np.prod(flat.shape[1:], dtype=np.int64))
    if total * row < RUN_BYTES * len(order):
        out_starts = starts_of(picked)[:-1]
        index = np.arange(total, dtype=np.int64) + np.repeat(starts[order] - out_starts, picked)
        return flat[index]
    lo = starts[order] * row
    out = join(slices(memoryview(np.ascontiguousarray(flat)).cast("B"), lo, lo + picked * row))
    if len(out) != total * row:  # a slice past the end comes back short, where an index would raise
        raise ValueError(f"records claim {total * row} bytes, {len(out)} of them are there")
    return out.view(flat.dtype).reshape(-1, *flat.shape[1:])


class Runs:
    """Records not yet copied: record k is ``sources[src[k]][pos[k]:pos[k] + nbytes[k]]`` (bytes;
    the sources are e.g. the pages of the gather's part files). A writer keeps these instead of a
    joined copy and copies them once, straight into the buffer they are written from
    (``write_to``): no fresh array per column, whose first touch costs more than the copy. The
    maker checks the runs against their sources (``core.events.decode_from`` does)."""

    __slots__ = ("nbytes", "pos", "sources", "src")

    def __init__(self, sources: list[np.ndarray], src: np.ndarray, pos: np.ndarray, nbytes: np.ndarray) -> None:
        self.sources, self.src, self.pos, self.nbytes = sources, src, pos, nbytes

    def __len__(self) -> int:
        return len(self.pos)

    @property
    def total(self) -> int:
        return int(self.nbytes.sum())

    def __getitem__(self, rows: slice) -> Runs:
        return Runs(self.sources, self.src[rows], self.pos[rows], self.nbytes[rows])

    def joined(self) -> np.ndarray:
        """The records back to back, as a new uint8 array."""
        if len(self.sources) == 1:
            return take_ragged(self.sources[0], self.nbytes, np.arange(len(self.pos)), starts=self.pos)
        out = np.empty(self.total, dtype=np.uint8)
        self._copy(out)
        return out

    def write_to(self, reserve: Callable[[int], memoryview], limit: int) -> None:
        """The records back to back through ``reserve(n)`` (the next ``n`` bytes of a file to fill),
        in pieces of at most ``limit`` bytes (or one record, if longer)."""
        ends = np.cumsum(self.nbytes)
        a, done = 0, 0
        while a < len(self.pos):
            b = max(a + 1, int(np.searchsorted(ends, done + limit, side="right")))
            size = int(ends[b - 1]) - done
            self[a:b]._copy(np.frombuffer(reserve(size), dtype=np.uint8))
            a, done = b, done + size

    def _copy(self, dst: np.ndarray) -> None:
        """The records back to back into ``dst``: one slice each (one index per byte for short ones)."""
        if not len(self.pos):
            return
        if len(self.sources) == 1 and len(dst) < RUN_BYTES * len(self.pos):
            dst[:] = self.joined()
            return
        with no_gc():
            views = [self.sources[s][p:p + n]
                     for s, p, n in zip(self.src.tolist(), self.pos.tolist(), self.nbytes.tolist())]
        np.concatenate(views, out=dst)
