"""Loaders of packed token datasets: fixed windows for training (TokenDataset) and whole documents.

Window i is tokens ``[i·L, i·L + L + 1)`` of the split's shards concatenated in order
(Megatron's convention: every token is a label once); ``x`` is the first L, ``y`` the last L.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.dtypes import safe_dtype
from shardsmith.core.identity import Stamp, open_checked, stamp
from shardsmith.errors import DatasetError
from shardsmith.formats.order import ResumableIterator
from shardsmith.formats.tokens.indexed import read_idx


class _TokenShards:
    """The .bin files of one split, memory-mapped lazily (so a forked worker maps its own)."""

    def __init__(self, out_dir: str | os.PathLike[str], split: str) -> None:
        self.out_dir = Path(out_dir)
        self.manifest, self.entries = manifest_mod.load_split(out_dir, fmt="tokens", split=split)
        self.split = split
        self.dtype = safe_dtype(self.manifest["tokenizer"]["dtype"], field="tokenizer.dtype")
        self.paths = [manifest_mod.resolve_inside(out_dir, e["path"]) for e in self.entries]
        self.index_paths = [manifest_mod.resolve_inside(out_dir, e["index"]["path"]) for e in self.entries]
        # what the lazily opened files must still be (``identity``)
        self.stamps = [stamp(path, size=e["bytes"]) for path, e in zip(self.paths, self.entries)]
        self.index_stamps = [stamp(path) for path in self.index_paths]
        for path, e in zip(self.paths, self.entries):
            if e["bytes"] % self.dtype.itemsize:
                raise DatasetError(f"{path}: size is not a multiple of the {self.dtype.name} token size")
        sizes = np.array([e["bytes"] // self.dtype.itemsize for e in self.entries], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.tokens = int(self.starts[-1])
        self._maps: list[np.ndarray] | None = None
        self._pid = -1
        self._doc_lengths: np.ndarray | None = None
        self._doc_ends: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a memory map pickles as a copy of its data: a spawned worker maps (and checks) its own
        return {**self.__dict__, "_maps": None, "_pid": -1}

    @property
    def maps(self) -> list[np.ndarray]:
        if self._maps is None or self._pid != os.getpid():
            self._maps = [self._map(p, e, st) for p, e, st in zip(self.paths, self.entries, self.stamps)]
            self._pid = os.getpid()
        return self._maps

    def _map(self, path: Path, entry: dict[str, Any], want: Stamp) -> np.ndarray:
        if not entry["bytes"]:
            return np.zeros(0, self.dtype)
        fd = open_checked(path, want)
        with os.fdopen(fd, "rb") as fh:
            return np.memmap(fh, dtype=self.dtype, mode="r")

    @property
    def doc_lengths(self) -> np.ndarray:
        """Every document's token count, in stream order, from the validated .idx files."""
        if self._doc_lengths is None:
            parts = []
            for e, path, index, want in zip(self.entries, self.paths, self.index_paths, self.index_stamps):
                idx = read_idx(index, bin_bytes=e["bytes"], stamp=want)
                if idx.dtype != self.dtype:
                    raise DatasetError(f"{path}: index dtype {idx.dtype} differs from the manifest's {self.dtype}")
                parts.append(idx.lengths)
            self._doc_lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._doc_lengths

    @property
    def doc_ends(self) -> np.ndarray:
        """Where each document ends in the stream (cumulative lengths)."""
        if self._doc_ends is None:
            self._doc_ends = np.cumsum(self.doc_lengths)
        return self._doc_ends

    def rows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """Tokens ``[s, s + width)`` of the concatenated stream for each start, one gather per shard."""
        out = np.empty((len(starts), width), dtype=self.dtype)
        shard = np.searchsorted(self.starts, starts, side="right") - 1
        inside = starts + width <= self.starts[shard + 1]
        maps = self.maps
        for s in np.unique(shard[inside]):
            rows = np.flatnonzero(inside & (shard == s))
            windows = np.lib.stride_tricks.sliding_window_view(maps[s], width)
            out[rows] = windows[starts[rows] - self.starts[s]]
        for r in np.flatnonzero(~inside):  # at most one window per shard boundary
            out[r] = self._span(int(starts[r]), width)
        return out

    def _span(self, start: int, width: int) -> np.ndarray:
        if width == 0:
            return np.zeros(0, dtype=self.dtype)
        pieces, pos, end = [], start, start + width
        while pos < end:
            s = int(np.searchsorted(self.starts, pos, side="right") - 1)
            stop = min(end, int(self.starts[s + 1]))
            pieces.append(self.maps[s][pos - self.starts[s]: stop - self.starts[s]])
            pos = stop
        return np.concatenate(pieces)


class TokenDataset:
    """Training windows of ``seq_len`` tokens over one split: ``ds[i] -> (x, y)``, ``get_batch``, ``iter``."""

    def __init__(self, out_dir: str | os.PathLike[str], *, seq_len: int | None = None, split: str = "train") -> None:
        self._shards = _TokenShards(out_dir, split)
        seq_len = seq_len or self._shards.manifest.get("seq_len")
        if not isinstance(seq_len, int) or seq_len < 1:
            raise DatasetError(f"{out_dir}: give seq_len (the manifest records none)")
        self.seq_len = seq_len
        self.split = split
        self.tokens = self._shards.tokens
        self.manifest = self._shards.manifest

    def __len__(self) -> int:
        return max(0, (self.tokens - 1) // self.seq_len)

    def _check(self, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if indices.size and (indices.min() < -n or indices.max() >= n):
            raise IndexError(f"window index out of range for {n} windows")
        return np.where(indices < 0, indices + n, indices)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.get_batch(np.array([i]))
        return x[0], y[0]

    def get_batch(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) int64 arrays of shape (B, L): one vectorized gather per shard, no loop per row."""
        idx = self._check(indices)
        rows = self._shards.rows(idx * self.seq_len, self.seq_len + 1)
        return rows[:, :-1].astype(np.int64), rows[:, 1:].astype(np.int64)

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """torch's DataLoader batch fetch: one gather for the whole batch."""
        x, y = self.get_batch(np.asarray(indices))
        return list(zip(x, y))

    def cu_seqlens(self, i: int) -> np.ndarray:
        """Document boundaries inside window i's ``x`` (0, ends…, L) for document-masked attention."""
        (i,) = self._check(np.array([i]))
        ends = self._shards.doc_ends
        start = int(i) * self.seq_len
        inside = ends[(ends > start) & (ends < start + self.seq_len)] - start
        return np.concatenate([[0], inside, [self.seq_len]]).astype(np.int32)

    def iter(self, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
             batch_size: int | None = None, drop_last: bool = False) -> ResumableIterator[Any]:
        """Walk this rank's slice of the epoch's permutation; yields (x, y) or batches of them."""
        return ResumableIterator(n=len(self), get_item=self.__getitem__, get_batch=self.get_batch,
                                 shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                                 batch_size=batch_size, drop_last=drop_last)


class TokenDocuments:
    """The documents of a packed split: ``ds[i]`` is document i's token ids (eos included)."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train") -> None:
        self._shards = _TokenShards(out_dir, split)
        self.manifest = self._shards.manifest
        self.split = split
        self.lengths = self._shards.doc_lengths
        self._starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"document {i} out of range for {n} documents")
        i %= n
        return self._shards._span(int(self._starts[i]), int(self.lengths[i])).astype(np.int64)

    def get_batch(self, indices: Any) -> list[np.ndarray]:
        return [self[int(i)] for i in np.asarray(indices)]

    def iter(self, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
             batch_size: int | None = None, drop_last: bool = False) -> ResumableIterator[Any]:
        return ResumableIterator(n=len(self), get_item=self.__getitem__, get_batch=self.get_batch,
                                 shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                                 batch_size=batch_size, drop_last=drop_last)
