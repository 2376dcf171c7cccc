"""``TarDataset.samples(indices)``: the samples of a run of an epoch's order one at a time, what
``ds.iter()`` and ``TarIterable`` without ``batch_size`` yield (``kit/pipeline.py``).

The order is taken a window at a time: numpy turns it into (shard, sample in shard) and, when the
window's shards are local, mapped whole, and every sample of them has the same members, into each
member's byte span. Samples are then sliced out of the maps a few at a time by C-level ``map``s over
those spans (no Python frame per sample or member), at most ``_BLOCK`` samples and ``_BLOCK_BYTES``
ahead of the one handed over, so memory stays bounded whatever the window. Anything else (a streamed
shard, samples with differing members, a member that does not decode) goes through the shard's own
reader, one sample at a time, which raises at the exact sample as ``ds[i]`` does. Issue 18's profile:
the exact order itself costs little (argsort of 64-bit keys, ~1 ms for 20k samples); per sample the
copy out of the page cache stays, and the Python frames (iterator, reader, decoder guard) were
what could go.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable
from functools import partial
from itertools import repeat
from operator import getitem
from typing import Any

import numpy as np

from shardsmith.core.identity import intact
from shardsmith.errors import DatasetError
from shardsmith.formats.webdataset.decode import load_npy

# a member that does not decode is read again by its shard's reader, whose error names the shard and byte
_NPY = partial(load_npy, where="a .npy member")


class _Uniform:
    """One mapped shard whose samples all have the same members: their spans as (samples, members)
    arrays, and what a sample dict needs (names, keys, bare decoders)."""

    __slots__ = ("data", "decoders", "keys", "mm", "names", "size", "where")

    def __init__(self, *, mm: Any, data: np.ndarray, size: np.ndarray, names: tuple[str, ...], keys: list[str],
                 decoders: list[Any], where: str) -> None:
        self.mm, self.data, self.size, self.names, self.keys, self.decoders = mm, data, size, names, keys, decoders
        self.where = where  # the shard's name, as errors give it


def _uniform(ds: Any, s: int) -> _Uniform | None:
    """Shard s as a ``_Uniform`` (mapped and tabled now, in this process), or None: also for a shard
    that cannot be opened, whose reader then raises at each of its own samples (the loader's skip
    policy replaces those, not the samples of other shards that share the window)."""
    try:
        if ds._files.keep_open is not None or not ds._files.whole(s):
            return None  # streamed: its reader counts what it reads and may let go of maps
        ds._reader(s)  # maps the shard and builds (and spot-checks) its member table
    except DatasetError:
        return None
    table, mm = ds._tables[s], ds._maps[s]
    if table is None or mm is None:
        return None
    counts = np.diff(np.frombuffer(table.first, np.int64))
    if not len(counts) or (counts != counts[0]).any():
        return None
    c = int(counts[0])
    ext = np.frombuffer(table.ext, np.dtype(table.ext.typecode)).reshape(-1, c)
    if not (ext == ext[0]).all():
        return None
    exts = [table.exts[e] for e in ext[0].tolist()]
    decoders = [ds._decoders[e] for e in exts]
    return _Uniform(mm=mm, data=np.frombuffer(table.data, np.int64).reshape(-1, c),
                    size=np.frombuffer(table.size, np.int64).reshape(-1, c), names=("__key__", *exts),
                    keys=table.keys, decoders=[_NPY if d is load_npy else d for d in decoders], where=ds._where[s])


class SampleIterator:
    """The samples at ``indices``, one ``next()`` at a time (``position``: those handed over). With
    ``mend``, a sample whose read raises ``DatasetError`` (its shard cut short, a member that does not
    decode) is ``mend(index, error)`` and the walk goes on (the loader's skip policy,
    ``kit/pipeline.py``); without, the error ends it."""

    _WINDOW = 4096  # positions turned into spans at once (ints only)
    _BLOCK = 32     # samples sliced ahead of the one handed over, and at most
    _BLOCK_BYTES = 8 << 20  # bytes of them (a larger sample goes alone)

    def __init__(self, ds: Any, indices: np.ndarray, *, mend: Callable[[int, DatasetError], Any] | None = None) -> None:
        self._ds = ds
        self._mend = mend
        self._order = indices
        self.position = 0
        self._starts = np.asarray(ds._starts, np.int64)
        self._shards: dict[int, _Uniform | None] = {}
        self._pid = -1
        self._first = self._end = 0  # the window's positions
        self._at = 0                 # the block's first position
        self._ahead: list[dict[str, Any] | None] = []
        self._whole: dict[int, tuple[Any, str]] = {}  # a window's shard -> (its map, its name): ``intact``

    def __iter__(self) -> SampleIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        pos = self.position
        k = pos - self._at
        try:
            if not 0 <= k < len(self._ahead):
                if pos >= len(self._order):
                    raise StopIteration
                self._block(pos)
                k = 0
            sample = self._ahead[k]
            if sample is None:  # not sliced ahead: the shard's own reader
                w = pos - self._first
                sample = self._ds._reader(self._shard[w])(self._local[w])
        except DatasetError as error:
            if self._mend is None:
                raise
            self._ahead = []  # the next sample is blocked anew (a shard cut short is checked again)
            sample = self._mend(int(self._order[pos]), error)
        self.position = pos + 1
        return sample

    def _window(self, pos: int) -> None:
        if self._pid != os.getpid():  # a forked worker maps its own shards
            self._shards, self._pid = {}, os.getpid()
        order = self._order[pos:pos + self._WINDOW]
        shard = np.searchsorted(self._starts, order, side="right") - 1
        local = order - self._starts[shard]
        self._first, self._end = pos, pos + len(order)
        self._shard, self._local = shard.tolist(), local.tolist()
        self._spans = None
        used, counts = np.unique(shard, return_counts=True)
        used = used.tolist()
        found = [self._shards[s] if s in self._shards else self._shards.setdefault(s, _uniform(self._ds, s))
                 for s in used]
        if not found or any(u is None or u.names != found[0].names or u.decoders != found[0].decoders
                            for u in found):
            return
        c = len(found[0].names) - 1
        start, size = np.empty((len(order), c), np.int64), np.empty((len(order), c), np.int64)
        by_shard = np.argsort(shard, kind="stable")  # the window's positions grouped by shard, in used's order
        ends = np.cumsum(counts).tolist()
        for u, a, b in zip(found, [0, *ends], ends):  # per shard its own positions (not a mask of the window)
            here = by_shard[a:b]
            start[here], size[here] = u.data[local[here]], u.size[local[here]]
        at = list(map(dict(zip(used, found)).__getitem__, self._shard))
        self._spans = (start.T.tolist(), (start + size).T.tolist(), found[0].names, found[0].decoders,
                       [u.mm for u in at], list(map(getitem, [u.keys for u in at], self._local)))
        self._whole = {s: (u.mm, u.where) for s, u in zip(used, found)}
        self._bytes = np.concatenate([[0], np.cumsum(size.sum(axis=1))]).tolist()  # before each position

    def _block(self, pos: int) -> None:
        """Samples from ``pos`` on, sliced ahead (or None each, to be read one at a time)."""
        if not self._first <= pos < self._end:
            self._window(pos)
        a, b = pos - self._first, min(pos - self._first + self._BLOCK, self._end - self._first)
        self._at = pos
        self._ahead = [None] * (b - a)
        if self._spans is None:
            return
        b = max(a + 1, bisect_right(self._bytes, self._bytes[a] + self._BLOCK_BYTES, a, b + 1) - 1)
        self._ahead = [None] * (b - a)
        starts, ends, names, decoders, maps, keys = self._spans
        maps, cols = maps[a:b], [keys[a:b]]
        for s in set(self._shard[a:b]):  # each file still whole before it is sliced (once per shard a block)
            mm, where = self._whole[s]
            if mm.size() < len(mm):  # (``intact``'s look, without its frame: the one line is its own)
                intact(mm, where)
        try:
            for m, decode in enumerate(decoders):
                raw = list(map(getitem, maps, map(slice, starts[m][a:b], ends[m][a:b])))
                cols.append(raw if decode is None else list(map(decode, raw)))
        except Exception:  # noqa: BLE001 -- read one at a time: the reader raises at the exact sample
            return
        self._ahead = list(map(dict, map(zip, repeat(names), zip(*cols))))
