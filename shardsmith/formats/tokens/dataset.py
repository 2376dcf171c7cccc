"""Loaders of packed token datasets: fixed windows for training (TokenDataset) and whole documents.

Window i is tokens ``[i·L, i·L + L + 1)`` of the split's shards concatenated in order
(Megatron's convention: every token is a label once); ``x`` is the first L, ``y`` the last L.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from shardsmith.core.dtypes import safe_dtype
from shardsmith.core.identity import intact
from shardsmith.errors import DatasetError
from shardsmith.formats.tokens.indexed import parse_idx
from shardsmith.formats.tokens.kinds import WindowsForm, tokenizer_of
from shardsmith.formats.tokens.masks import ShardMasks
from shardsmith.formats.tokens.origins import described, load_origins
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.dataset_files import files_for
from shardsmith.kit.sample_kind import ListForm, SampleKind


class _TokenShards:
    """The .bin files of one split, memory-mapped lazily (so a forked worker maps its own)."""

    def __init__(self, out_dir: str | os.PathLike[str], split: str, **cache: Any) -> None:
        self._files = files_for(out_dir, **cache)
        self.out_dir = self._files.root
        # the shards' paths and identities (what the lazily opened files must still be) taken now
        self.manifest, self.entries = self._files.load_split(fmt="tokens", split=split)
        self.split = split
        self.dtype = safe_dtype(self.manifest["tokenizer"]["dtype"], field="tokenizer.dtype")
        self.paths = self._files.names
        self.index_paths = [self._files.name_of(e["index"]["path"]) for e in self.entries]
        self.index_stamps = [self._files.stamp_of(path) for path in self.index_paths]
        for path, e in zip(self.paths, self.entries):
            if e["bytes"] % self.dtype.itemsize:
                raise DatasetError(f"{path}: size is not a multiple of the {self.dtype.name} token size")
        sizes = np.array([e["bytes"] // self.dtype.itemsize for e in self.entries], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.tokens = int(self.starts[-1])
        self._maps: list[np.ndarray] | None = None
        self._files_mapped: dict[int, mmap.mmap] = {}  # shard -> its map (looked at before each read: ``intact``)
        self._some: list[np.ndarray | None] = []  # a streamed dataset's maps: a few shards at a time
        self._mapped: list[int] = []
        self._pid = -1
        self._doc_lengths: np.ndarray | None = None
        self._doc_ends: np.ndarray | None = None
        self._origins: np.ndarray | None = None
        self._masks: ShardMasks | None = None
        self._views: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (shard, width) -> (map, windows)
        self.chat = self.manifest.get("chat") is not None  # --chat: a loss bit per token beside each shard

    def __getstate__(self) -> dict[str, Any]:
        # a memory map pickles as a copy of its data: a spawned worker maps (and checks) its own
        return {**self.__dict__, "_maps": None, "_some": [], "_mapped": [], "_pid": -1, "_views": {},
                "_files_mapped": {}}

    @property
    def maps(self) -> list[np.ndarray]:
        """Every shard mapped (a local dataset: all at once, each checked against its identity)."""
        if self._maps is None or self._pid != os.getpid():
            self._files_mapped = {}
            self._maps = [self._map(s) for s in range(len(self.entries))]
            self._pid = os.getpid()
        return self._maps

    def _map(self, s: int) -> np.ndarray:
        if not self.entries[s]["bytes"]:
            return np.zeros(0, self.dtype)
        fd = self._files.open(s, release=self._let_go)
        try:
            mm = self._files_mapped[s] = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)  # (the map holds its own descriptor, and with it the cache's hold on the file)
        return np.frombuffer(mm, dtype=self.dtype)

    def array(self, s: int, maps: list[np.ndarray] | None = None) -> np.ndarray | None:
        """Shard s's tokens mapped, or None when it is read by byte ranges (streamed, not cached);
        the file is looked at first: one truncated under its map is a DatasetError, never SIGBUS.
        ``maps``: ``self.maps``, taken once for a batch of a local dataset (one ``getpid``, not one a shard)."""
        arr = self._array(s) if maps is None else maps[s]
        mm = self._files_mapped.get(s)
        if arr is not None and mm is not None:
            intact(mm, self.paths[s])
        return arr

    def _array(self, s: int) -> np.ndarray | None:
        if self._files.keep_open is None:
            return self.maps[s]
        if self._pid != os.getpid():
            self._some, self._mapped, self._pid = [None] * len(self.entries), [], os.getpid()
            self._files_mapped = {}
        arr = self._some[s]
        if arr is None:
            if self.entries[s]["bytes"] and not self._files.whole(s):
                return None
            arr = self._some[s] = self._map(s)
            self._mapped.append(s)
            if len(self._mapped) > self._files.keep_open:  # let the oldest go: the cache may evict it
                old = self._mapped.pop(0)
                self._some[old] = None
                self._files_mapped.pop(old, None)
        return arr

    def _let_go(self) -> None:
        """Unmap the streamed shards (waiting for room in the cache, a process lets go of its own)."""
        self._some, self._mapped, self._views = [None] * len(self.entries), [], {}
        self._files_mapped = {}

    def release(self) -> None:
        """Unmap the streamed shards now (see ``TarDataset.release``); a local dataset keeps its maps."""
        if self._masks is not None:
            self._masks.release()
        self._let_go()
        self._files.let_go()

    def ranged(self, s: int, starts: np.ndarray, width: int) -> np.ndarray:
        """Tokens ``[a, a + width)`` of shard s for each start, by byte ranges."""
        size = self.dtype.itemsize
        got = self._files.read_ranges(s, (starts * size).tolist(), ((starts + width) * size).tolist())
        return np.frombuffer(b"".join(got), dtype=self.dtype).reshape(len(starts), width)

    def shard_of(self, starts: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, starts, side="right") - 1

    @property
    def doc_lengths(self) -> np.ndarray:
        """Every document's token count, in stream order, from the validated .idx files."""
        if self._doc_lengths is None:
            parts = []
            for e, path, index, want in zip(self.entries, self.paths, self.index_paths, self.index_stamps):
                idx = parse_idx(self._files.sidecar(e["index"], want=want), index, bin_bytes=e["bytes"])
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

    def loss_mask(self, start: int, width: int) -> np.ndarray:
        """The loss bits of tokens ``[start, start + width)`` of the split (a chat dataset's)."""
        if self._masks is None:
            self._masks = ShardMasks(self._files, self.entries, self.starts, where=self.out_dir)
        return self._masks.span(start, width)

    def origins(self, counts: list[int]) -> np.ndarray:
        """Every document's (or packed piece's: ``counts`` per shard) origin row, in split order
        (``pack-tokens --provenance``; read on first use, never to serve tokens)."""
        if self._origins is None:
            self._origins = load_origins(self._files, self.entries, counts, where=self.out_dir)
        return self._origins

    def sources(self, docs: np.ndarray, spans: list[tuple[int, int]], counts: list[int]) -> list[dict[str, Any]]:
        """``described`` of documents ``docs`` (indices into ``origins``) with their spans in a sample."""
        return described(self.origins(counts)[docs], spans, self.manifest, where=self.out_dir)

    def rows(self, starts: np.ndarray, width: int, *, out: np.ndarray | None = None,
             at: np.ndarray | None = None) -> np.ndarray:
        """Tokens ``[s, s + width)`` of the concatenated stream for each start, one gather per shard;
        into rows ``at`` of ``out`` when given (a mixture gathers its sources into one batch)."""
        if out is None:
            out = np.empty((len(starts), width), dtype=self.dtype)
        shard = np.searchsorted(self.starts, starts, side="right") - 1
        inside = starts + width <= self.starts[shard + 1]
        every = bool(inside.all())
        order = np.argsort(shard, kind="stable") if every else np.flatnonzero(inside)
        if not every:
            order = order[np.argsort(shard[order], kind="stable")]  # the rows grouped by shard, one sort
        ss = shard[order]
        edges = [0, *(np.flatnonzero(ss[1:] != ss[:-1]) + 1).tolist(), len(order)] if len(order) else [0]
        maps = self.maps if self._files.keep_open is None else None
        for a, b in zip(edges[:-1], edges[1:]):
            rows, s = order[a:b], int(ss[a])
            self._files.touched(s, len(rows))
            arr = self.array(s, maps)
            dest = rows if at is None else at[rows]
            if arr is None:
                out[dest] = self.ranged(s, starts[rows] - self.starts[s], width)
                continue
            out[dest] = self._windows(s, arr, width)[starts[rows] - self.starts[s]]
        for r in ([] if every else np.flatnonzero(~inside).tolist()):  # at most one window per shard boundary
            self._files.touched(int(shard[r]))
            out[r if at is None else at[r]] = self._span(int(starts[r]), width)
        return out

    def _windows(self, s: int, arr: np.ndarray, width: int) -> np.ndarray:
        """Shard s's windows of ``width`` tokens as one strided view, kept while the map is the same
        (making it is most of a small batch's cost per shard)."""
        got = self._views.get((s, width))
        if got is None or got[0] is not arr:
            got = self._views[(s, width)] = (arr, np.lib.stride_tricks.sliding_window_view(arr, width))
        return got[1]

    def _span(self, start: int, width: int) -> np.ndarray:
        if width == 0:
            return np.zeros(0, dtype=self.dtype)
        pieces, pos, end = [], start, start + width
        while pos < end:
            s = int(np.searchsorted(self.starts, pos, side="right") - 1)
            stop = min(end, int(self.starts[s + 1]))
            arr = self.array(s)
            a, b = pos - int(self.starts[s]), stop - int(self.starts[s])
            pieces.append(arr[a:b] if arr is not None else self.ranged(s, np.array([a]), b - a)[0])
            pos = stop
        return np.concatenate(pieces)


class TokenDataset(Dataset):
    """Training windows of ``seq_len`` tokens over one split: ``ds[i] -> (x, y)``, ``get_batch``, ``iter``."""

    def __init__(self, out_dir: str | os.PathLike[str], *, seq_len: int | None = None, split: str = "train",
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None,
                 windows_of_chat: bool = False) -> None:
        """``out_dir``: a dataset folder, or a URL read through a local cache in ``cache_dir`` of at
        most ``cache_limit`` bytes (``shardsmith.loader.open``). A chat dataset (``--chat``) is
        refused: windows cross conversations and ignore its loss mask (``windows_of_chat``: tools
        that read its tokens only, never for training)."""
        self._shards = _TokenShards(out_dir, split, cache_dir=cache_dir, cache_limit=cache_limit)
        if self._shards.chat and not windows_of_chat:
            raise DatasetError(f"{out_dir}: a chat dataset (pack-tokens --chat): windows would cross conversations "
                               f"and train on every token; read its conversations (shardsmith.open gives "
                               f"TokenDocuments, with loss_mask) or pack it (--pack best-fit)")
        if seq_len is not None and (type(seq_len) is not int or seq_len < 1):  # (a bool is not a length)
            raise ValueError(f"seq_len={seq_len!r}: give a whole number of tokens, at least 1")
        seq_len = seq_len or self._shards.manifest.get("seq_len")
        if type(seq_len) is not int or seq_len < 1:
            raise DatasetError(f"{out_dir}: give seq_len (the manifest records none)")
        self.seq_len = seq_len
        self.split = split
        self.tokens = self._shards.tokens
        self.manifest = self._shards.manifest

    def __len__(self) -> int:
        return max(0, (self.tokens - 1) // self.seq_len)

    def origin(self, i: int) -> tuple[str, str]:
        """(the shard window ``i`` starts in, ``window i``), as a skip names it."""
        s = int(np.searchsorted(self._shards.starts, int(i) * self.seq_len, side="right")) - 1
        return str(self._shards.paths[s]), f"window {int(i)}"

    def _check(self, indices: np.ndarray) -> np.ndarray:
        """Window indices as non-negative int64, or IndexError: a float or a bool is not an index, and
        an int beyond int64 (``trace OUT 99999999999999999999``) is out of range, not an OverflowError."""
        given = np.asarray(indices)
        n = len(self)
        if not given.size:
            return np.zeros(given.shape, np.int64)
        if given.dtype.kind not in "iu":
            items = np.asarray(indices, dtype=object).ravel().tolist()
            if all(type(v) is int for v in items):  # Python ints that no 64-bit dtype holds together
                raise IndexError(f"window index out of range for {n} windows")
            raise IndexError(f"window indices must be integers, not {given.dtype}")
        lo, hi = given.min(), given.max()
        if lo < -n or hi >= n:
            raise IndexError(f"window index out of range for {n} windows")
        given = given.astype(np.int64, copy=False)  # (read only from here: the caller's array may be returned)
        return given if lo >= 0 else np.where(given < 0, given + n, given)

    @property
    def kind(self) -> SampleKind:
        return SampleKind("token windows", WindowsForm(),
                          (("seq_len", self.seq_len), ("tokenizer", tokenizer_of(self.manifest))))

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.read(np.array([i]))
        return x[0], y[0]

    def read(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) int64 arrays of shape (B, L): one vectorized gather per shard, no loop per row."""
        idx = self._check(indices)
        return self.split_windows(self.fill_windows(idx, np.empty((len(idx), self.seq_len + 1), self.dtype)))

    get_batch = read

    @property
    def dtype(self) -> np.dtype:
        """The ids' dtype on disk (the rows ``fill_windows`` fills)."""
        return self._shards.dtype

    def fill_windows(self, indices: np.ndarray, out: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
        """Windows ``indices`` (in range, non-negative) as their L + 1 tokens, into rows ``at`` of
        ``out`` (every row in order when None): the gather of ``get_batch``, which a mixture of
        token sources runs for each source into one batch before one ``split_windows``."""
        return self._shards.rows(indices * self.seq_len, self.seq_len + 1, out=out, at=at)

    @staticmethod
    def split_windows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Windows' L + 1 tokens as (x, y) int64, the targets shifted by one."""
        return rows[:, :-1].astype(np.int64), rows[:, 1:].astype(np.int64)

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """torch's DataLoader batch fetch: one gather for the whole batch."""
        x, y = self.get_batch(np.asarray(indices))
        return list(zip(x, y))

    def release(self) -> None:
        """Let go of the streamed shards this process maps (the cache may evict them)."""
        self._shards.release()

    def cu_seqlens(self, i: int) -> np.ndarray:
        """Document boundaries inside window i's ``x`` (0, ends…, L) for document-masked attention."""
        (i,) = self._check(np.array([i]))
        ends = self._shards.doc_ends
        start = int(i) * self.seq_len
        inside = ends[(ends > start) & (ends < start + self.seq_len)] - start
        return np.concatenate([[0], inside, [self.seq_len]]).astype(np.int32)

    def sources(self, i: int) -> list[dict[str, Any]]:
        """The documents window i's L + 1 tokens come from (``x`` is tokens ``[0, L)``, ``y``
        ``[1, L + 1)``), in order: ``input`` (its path in the manifest's inputs), its line or row
        (1-based, as errors name it) and ``record`` (0-based), ``offset`` (the byte its line starts
        at, plain JSONL; else None), ``hash`` (of its text as read) and ``start``/``stop``, the
        document's tokens inside the window. A dataset made without ``--provenance`` raises
        DatasetError."""
        (i,) = self._check(np.array([i]))
        shards = self._shards
        start, stop = int(i) * self.seq_len, int(i) * self.seq_len + self.seq_len + 1
        ends, lengths = shards.doc_ends, shards.doc_lengths
        begins = ends - lengths
        lo, hi = int(np.searchsorted(ends, start, side="right")), int(np.searchsorted(begins, stop, side="left"))
        docs = np.arange(lo, hi)[lengths[lo:hi] > 0]
        spans = [(max(int(begins[k]), start) - start, min(int(ends[k]), stop) - start) for k in docs.tolist()]
        return shards.sources(docs, spans, [int(e["samples"]) for e in shards.entries])

    def prefetch(self, indices: Any) -> None:
        """The windows this process reads next, in order: a streamed dataset downloads their shards
        a few ahead, within its cache's limit (a local one has nothing to do)."""
        self._shards._files.plan(self._shards.shard_of(np.asarray(indices, np.int64) * self.seq_len),
                                 release=self.release)


class TokenDocuments(Dataset):
    """The documents of a packed split: ``ds[i]`` is document i's token ids (eos included); of a
    chat dataset (``--chat``), ``{"tokens", "loss_mask"}``: a conversation's ids and, per token,
    whether the loss counts it."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train",
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None) -> None:
        self._shards = _TokenShards(out_dir, split, cache_dir=cache_dir, cache_limit=cache_limit)
        self.manifest = self._shards.manifest
        self.split = split
        self.lengths = self._shards.doc_lengths
        self.item_kind = "tokens and loss_mask" if self._shards.chat else "tokens"  # what mix checks alike
        self._starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def _start(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"document {i} out of range for {n} documents")
        start = int(self._starts[i % n])
        self._shards._files.touched(int(self._shards.shard_of(start)))
        return start

    def tokens(self, i: int) -> np.ndarray:
        """Document i's ids, int64 (of a chat dataset too)."""
        return self._shards._span(self._start(i), int(self.lengths[i % len(self)])).astype(np.int64)

    def __getitem__(self, i: int) -> Any:
        start, n = self._start(i), int(self.lengths[i])
        tokens = self._shards._span(start, n).astype(np.int64)
        if not self._shards.chat:
            return tokens
        return {"tokens": tokens, "loss_mask": self._shards.loss_mask(start, n)}

    def release(self) -> None:
        """Let go of the streamed shards this process maps (the cache may evict them)."""
        self._shards.release()

    @property
    def kind(self) -> SampleKind:
        return SampleKind("documents", ListForm(), (("items", self.item_kind), ("tokenizer", tokenizer_of(self.manifest))))

    def read(self, indices: Any) -> list[Any]:
        return [self[int(i)] for i in np.asarray(indices).reshape(-1)]

    get_batch = read

    def prefetch(self, indices: Any) -> None:
        """The documents this process reads next, in order (see ``TokenDataset.prefetch``)."""
        self._shards._files.plan(self._shards.shard_of(self._starts[np.asarray(indices, np.int64)]),
                                 release=self.release)

