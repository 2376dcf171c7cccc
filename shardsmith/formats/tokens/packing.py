"""Best-fit decreasing packing of documents into fixed-length sequences, over a bounded window.

Documents arrive in the run's (shuffled) order. They collect in a window until it holds
``window_tokens`` tokens; the window is then packed and emitted, and the next one starts empty, so
the packer never holds more than ``window_tokens`` plus one document. A document longer than
``seq_len`` is cut into ``seq_len``-token pieces (the last one shorter). Inside a window the
pieces are placed largest first, each into the open sequence whose free space is the smallest
that still fits it (best fit), or into a new sequence. Sequences leave in the order they were
opened, and the documents inside one sequence keep their order in the stream: the pieces of a
split document therefore appear in order (full pieces open their own sequences before any
shorter piece is placed). Everything depends only on the documents in order: the same input
gives the same sequences whatever the batches they came in.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

_KEY = 1 << 32  # a free-space key: free * _KEY + sequence number (best fit, then the oldest sequence)


@dataclass(frozen=True, slots=True)
class Packed:
    """One sequence: its document pieces in order (token arrays), and counts for the manifest:
    ``starts`` pieces that begin a document, ``split`` of those whose document was cut."""

    pieces: list[np.ndarray]
    starts: int
    split: int

    @property
    def real(self) -> int:
        return sum(len(p) for p in self.pieces)


def best_fit(lengths: list[int], seq_len: int) -> list[list[int]]:
    """Bins (lists of item positions, ascending) of best-fit decreasing, in the order they opened."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []  # keys of sequences with free space, ascending
    for i in order:
        n = lengths[i]
        at = bisect_left(free, n * _KEY)
        if at < len(free):
            key = free.pop(at)
            b, left = key % _KEY, key // _KEY - n
        else:
            b, left = len(bins), seq_len - n
            bins.append([])
        bins[b].append(i)
        if left:
            insort(free, left * _KEY + b)
    for b in bins:
        b.sort()
    return bins


class BestFitPacker:
    """Feed documents with ``add`` (sequences come out as windows fill), then ``finish``."""

    def __init__(self, *, seq_len: int, window_tokens: int) -> None:
        if seq_len < 1 or seq_len >= _KEY:
            raise ValueError(f"seq_len {seq_len} out of range")
        self.seq_len = seq_len
        self.window_tokens = max(int(window_tokens), seq_len)
        self._items: list[np.ndarray] = []
        self._first: list[bool] = []  # the piece begins its document
        self._cut: list[bool] = []  # the piece's document is longer than seq_len
        self._held = 0
        self.peak_tokens = 0  # the most tokens the window ever held (tests check the bound)

    def add(self, doc: np.ndarray) -> Iterator[Packed]:
        n, step = len(doc), self.seq_len
        if n == 0:
            return
        for at in range(0, n, step):
            self._items.append(doc[at:at + step])
            self._first.append(at == 0)
            self._cut.append(n > step)
        self._held += n
        self.peak_tokens = max(self.peak_tokens, self._held)
        if self._held >= self.window_tokens:
            yield from self._flush()

    def finish(self) -> Iterator[Packed]:
        yield from self._flush()

    def _flush(self) -> Iterator[Packed]:
        items, first, cut = self._items, self._first, self._cut
        self._items, self._first, self._cut, self._held = [], [], [], 0
        for b in best_fit([len(x) for x in items], self.seq_len):
            yield Packed(pieces=[items[i] for i in b], starts=sum(first[i] for i in b),
                         split=sum(first[i] and cut[i] for i in b))


def window_tokens(*, memory: int, seq_len: int, itemsize: int) -> int:
    """The window for a ``--memory`` budget: an eighth of it in tokens, and at least 8 sequences."""
    return max(memory // 8 // itemsize, 8 * seq_len)
