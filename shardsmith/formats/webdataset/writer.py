"""WebDataset tar shards ``{split}-{000000}.tar``, a per-shard offset index, and a wids shard index.

Samples arrive as complete tar members (headers, data and padding built by the workers, see
``shardsmith.formats.webdataset.tarfmt``), so writing a shard is appending bytes. Each shard gets
``__index__/{split}-{000000}.offsets.npy`` (``tarfmt.index_array``: where each sample and each of its
members starts, member sizes and extensions, sample keys) for O(1) random access without reading the
tar's headers, and the split gets ``__index__/{split}.wids.json``. The indexes live in their own
folder (``names.INDEX_DIR``) so that a reader of the folder's files by name (HuggingFace
``datasets``' ``webdataset`` builder) finds the tars alone; the manifest names where they are.

Why ``__index__``: HuggingFace ``datasets``' packaged builders named with ``data_dir`` take every
file whose name holds a split keyword (``train``, ``val``, ``test``, … delimited by ``-._ 0-9/``) and
skip only folders whose names start with ``__`` (``data_files._is_inside_unrequested_special_dir``,
parent folders only: a file named ``__x`` is still taken) and hidden files and folders (names
starting with ``.``). ``__index__`` rather than a hidden ``.index``: it shows in a listing, and
shardsmith's own code takes names starting with a dot for temporary files and run state. Until this
layout (before 2026-11-25) the indexes were beside the shards (``{split}-N.offsets.npy``,
``{split}.wids.json`` with urls that were the shards' names); the manifest names every index by its
path (``index.path``, ``wids``, ``files``) and every reader (loader, streamed loader, ``verify``,
``inspect``, the card) follows those paths, so such a dataset reads as before and the manifest's
version stays 1 (``tests/test_index_folder.py``). A wids list's urls are relative to the list
(``../{split}-N.tar``: wids resolves a relative url against the folder of the list it read, by
``os.path.join`` and ``normpath``, for a local path and an ``s3://`` or ``https://`` URL alike), and
``verify`` resolves them the same way. ``--overwrite`` removes the index folder with the dataset
when it holds only index files (the tar formats declare it and what it holds:
``formats/webdataset/names.py``), else names the file it left.
"""

from __future__ import annotations

import posixpath
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from shardsmith.core.fsutil import HashingFile, atomic_write_bytes, fsync_dir
from shardsmith.core.npy import npy_bytes
from shardsmith.core.ragged import starts_of
from shardsmith.errors import DataError
from shardsmith.formats.webdataset.names import INDEX_DIR, offsets_name, wids_name
from shardsmith.formats.webdataset.tarfmt import (
    BLOCK,
    end_of_archive,
    index_array,
    padding,
    parse_header,
    parse_members,
    scan_samples,
)
from shardsmith.kit.rollover import Rollover, runs
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

_REF = struct.Struct("<8sQQ")
REF_MAGIC = b"SSREF\x00\x00\x01"


@dataclass(frozen=True, slots=True)
class SourceRef:
    """A member's data by reference: ``size`` bytes of input file ``index``, copied at write time.

    Sent through the shuffle in place of the bytes, right after the member's header, so an image
    that goes into the tar unchanged is read once to check it and once to write it, never spilled.
    """

    index: int
    size: int

    def pack(self) -> bytes:
        return _REF.pack(REF_MAGIC, self.index, self.size)


@dataclass(slots=True)
class _ShardPlan:
    """One shard's samples in order: (first header, source file, data size, the other members)."""

    index: int
    samples: list[tuple[bytes, int, int, bytes]] = field(default_factory=list)
    bytes: int = 0


@dataclass(slots=True)
class ShardIndex:
    """A shard's samples as they are appended: where each starts, its key, and its members'
    extensions, data offsets and sizes (what ``tarfmt.index_array`` stores)."""

    starts: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    ext_names: list[str] = field(default_factory=list)
    data: list[Any] = field(default_factory=list)  # int64 arrays, appended in order
    size: list[Any] = field(default_factory=list)

    def add(self, start: int, members: list[tuple[str, int, int]]) -> None:
        """One sample at byte ``start``: its members as (``key.ext`` name, data offset, size)."""
        self.starts.append(start)
        self.keys.append(members[0][0].partition(".")[0])
        self.counts.append(len(members))
        self.ext_names += [name.partition(".")[2] for name, _, _ in members]
        self.data.append(np.fromiter((d for _, d, _ in members), np.int64, count=len(members)))
        self.size.append(np.fromiter((n for _, _, n in members), np.int64, count=len(members)))

    def add_scanned(self, base: int, starts: np.ndarray, found: Any, a: int, b: int) -> None:
        """Samples a..b-1 of a buffer ``scan_samples`` read (``starts``: their offsets in it), placed
        so that the buffer's byte 0 is the shard's byte ``base``."""
        lo, hi = int(found.first[a]), int(found.first[b])
        self.starts += (starts[a:b] + base).tolist()
        self.keys += found.keys[a:b]
        self.counts += np.diff(found.first[a:b + 1]).tolist()
        self.ext_names += [found.exts[e] for e in found.ext[lo:hi].tolist()]
        self.data.append(found.data[lo:hi] + base)
        self.size.append(found.size[lo:hi])

    def array(self, end: int) -> np.ndarray:
        first = np.zeros(len(self.counts) + 1, np.int64)
        np.cumsum(self.counts, out=first[1:])
        cat = np.concatenate
        return index_array([*self.starts, end], first, cat(self.data) if self.data else [],
                           cat(self.size) if self.size else [], self.ext_names, self.keys)


def index_folder(out_dir: Path) -> Path:
    """The dataset's index folder, made when missing (its entry in ``out_dir`` made durable)."""
    folder = Path(out_dir) / INDEX_DIR
    if not folder.is_dir():
        folder.mkdir(exist_ok=True)  # (gather ranks of one split may make it at once)
        fsync_dir(Path(out_dir))
    return folder


def finish_shard(tar: HashingFile, index: ShardIndex | np.ndarray, out_dir: Path) -> tuple[ShardRecord, str | None]:
    """End the archive, commit it, and write its offset index into the index folder (``index``: the
    samples appended, or the index array of them, ``index_array`` with the end of the data last
    among the offsets)."""
    end = tar.bytes
    tar.write(end_of_archive(end))
    sha = tar.commit()
    arr = index.array(end) if isinstance(index, ShardIndex) else index
    samples = len(index.starts) if isinstance(index, ShardIndex) else int(arr[2])
    rel = offsets_name(tar.path.name)
    index_folder(out_dir)
    idx = HashingFile(Path(out_dir) / rel)
    idx.write(npy_bytes(arr))
    idx_sha = idx.commit()
    record = ShardRecord(path=tar.path.name, samples=samples, bytes=tar.bytes, sha256=sha,
                         extra={"index": {"path": rel, "bytes": idx.bytes, "sha256": idx_sha}})
    return record, tar.md5


def write_wids(out_dir: Path, split: str, shards: list[ShardRecord], md5s: list[str | None]) -> None:
    """``__index__/{split}.wids.json``: the shard list wids' ShardListDataset reads, each url relative
    to the file (``../{split}-000000.tar``: wids resolves it against the folder the list was read from)."""
    rel = wids_name(split)
    shardlist = []
    for shard, md5 in zip(shards, md5s):
        url = posixpath.relpath(shard.path, posixpath.dirname(rel))
        entry: dict = {"url": url, "nsamples": shard.samples, "filesize": shard.bytes}
        if md5:
            entry["md5sum"] = md5
        shardlist.append(entry)
    index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": split, "shardlist": shardlist}
    index_folder(out_dir)
    atomic_write_bytes(Path(out_dir) / rel, orjson.dumps(index, option=orjson.OPT_INDENT_2))


def closed_size(size: int) -> int:
    """A shard's size once closed: two zero blocks, padded to whole 10240-byte records."""
    return -(-(size + 1024) // 10240) * 10240


def max_tar_weight(shard_bytes: int) -> int:
    """The most sample bytes a shard may hold so that, closed, it stays within ``shard_bytes``
    (``closed_size(x) > shard_bytes`` exactly when ``x`` exceeds this)."""
    return shard_bytes // 10240 * 10240 - 1024


class TarWriter(Writer):
    """Rolls tar shards over at ``shard_samples`` samples or ``shard_bytes`` bytes, whichever comes first."""

    name = "webdataset"
    suffix = ".tar"

    def __init__(self, *, out_dir: Path, split: str, shard_samples: int | None, shard_bytes: int,
                 wids_md5: bool = False, sources: list[str] | None = None, threads: int = 2,
                 part: ShardRange | None = None) -> None:
        """``sources``: input paths by file index, when samples carry ``SourceRef``s to expand;
        ``threads``: shards written at once in that case."""
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.sources = sources
        self.shard_samples = shard_samples
        self.shard_bytes = shard_bytes
        self.wids_md5 = wids_md5
        self._roller = self.rollover()
        self._tar: HashingFile | None = None
        self._index = ShardIndex()
        self.threads = threads
        self._plan: _ShardPlan | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future[tuple[ShardRecord, str | None]]] = []

    @property
    def weigh_payload(self) -> bool:
        return self.sources is not None  # a SourceRef's size is in the payload

    def rollover(self) -> Rollover:
        return Rollover(max_weight=max_tar_weight(self.shard_bytes), max_samples=self.shard_samples)

    def weights(self, lengths: np.ndarray, payload: memoryview | None) -> np.ndarray:
        """Sample bytes in the tar: a SourceRef counts as the data it stands for."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if self.sources is None:
            return lengths
        assert payload is not None
        out = lengths.copy()
        pos = 0
        for i, n in enumerate(lengths.tolist()):
            magic, _, size = _REF.unpack_from(payload, pos + BLOCK)
            if magic != REF_MAGIC:
                raise AssertionError("sample without the SourceRef the writer expects")
            out[i] = n - _REF.size + size + len(padding(size))
            pos += n
        return out

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        """Append whole samples; a shard never splits a sample."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if self.sources is not None:
            self._write_referenced(lengths, payload)
            return
        starts = starts_of(lengths)
        # every member of the batch (our own headers: checked and read in numpy), for the offset index
        found = scan_samples(payload, starts, where=f"{self.split} batch")
        for a, b, new in runs(self._roller.cut(lengths), len(lengths)):
            if new:
                self._roll()
            if self._tar is None:
                self._tar = HashingFile(self.out_dir / self.shard_name(self.next_index()), md5=self.wids_md5)
            base = self._tar.bytes - int(starts[a])
            self._index.add_scanned(base, starts, found, a, b)
            self._tar.write(payload[int(starts[a]):int(starts[b])])

    def _write_referenced(self, lengths: np.ndarray, payload: memoryview) -> None:
        """Samples whose first member's data is a SourceRef: plan shards here, write them on threads.

        The plan (headers and small members, ~1 KB a sample) is made in order, so shard boundaries
        are exactly those of a sequential write; reading the images, hashing and writing happen
        for several shards at once (file reads, hashing and writes release the GIL).
        """
        weights = self.weights(lengths, payload)
        cuts = set(self._roller.cut(weights))
        pos = 0
        for i, n in enumerate(lengths.tolist()):
            _, index, size = _REF.unpack_from(payload, pos + BLOCK)
            if i in cuts:
                self._submit()
            if self._plan is None:
                self._plan = _ShardPlan(index=self.next_index() + len(self._futures))
            self._plan.samples.append((bytes(payload[pos:pos + BLOCK]), index, size,
                                       bytes(payload[pos + BLOCK + _REF.size:pos + n])))
            self._plan.bytes += int(weights[i])
            pos += n

    def _submit(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix=f"tar {self.split}")
        self._futures.append(self._pool.submit(self._write_plan, self._plan))
        self._plan = None
        waiting = [f for f in self._futures if not f.done()]
        if len(waiting) > 2 * self.threads:  # planning outruns the writers: hold few plans in memory
            waiting[0].result()

    def _write_plan(self, plan: _ShardPlan) -> tuple[ShardRecord, str | None]:
        assert self.sources is not None
        tar = HashingFile(self.out_dir / self.shard_name(plan.index), md5=self.wids_md5)
        try:
            shard_index = ShardIndex()
            pieces: list[bytes] = []
            pending = 0
            for header, index, size, rest in plan.samples:
                start = tar.bytes + pending
                name, _ = parse_header(header, where=tar.path.name, offset=start)
                after = start + BLOCK + size + len(padding(size))
                shard_index.add(start, [(name, start + BLOCK, size),
                                        *((n, after + d, k) for n, d, k in
                                          (parse_members(rest, 0, len(rest)) if rest else ()))])
                path = self.sources[index]
                with open(path, "rb") as fh:
                    data = fh.read(size + 1)
                if len(data) != size:
                    raise DataError(file=path, reason=f"changed while converting: {len(data)} bytes, was {size}")
                pieces += [header, data, padding(size), rest]
                pending += BLOCK + size + len(padding(size)) + len(rest)
                if pending >= 4 << 20:
                    tar.write(b"".join(pieces))
                    pieces, pending = [], 0
            if pieces:
                tar.write(b"".join(pieces))
            return finish_shard(tar, shard_index, self.out_dir)
        except BaseException:
            tar.abort()
            raise

    def _roll(self) -> None:
        tar = self._tar
        assert tar is not None
        record, md5 = finish_shard(tar, self._index, self.out_dir)
        self.shards.append(record)
        self.md5s.append(md5)
        self._tar, self._index = None, ShardIndex()

    def shard_full(self) -> None:
        if self.sources is not None:
            return  # shards planned from SourceRefs are written on threads: left to the next sample
        if self._tar is not None:
            self._roll()
        self._roller = self.rollover()  # an empty shard: the next sample opens one

    def close(self) -> list[ShardRecord]:
        if self._tar is not None:
            self._roll()
        if self._plan is not None:
            self._submit()
        try:
            for future in self._futures:
                record, md5 = future.result()
                self.shards.append(record)
                self.md5s.append(md5)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
        return self.shards

    def finish_split(self, pieces: list[dict[str, Any]]) -> dict[str, Any]:
        """The split's wids index, over every writer's shards."""
        shards = [ShardRecord.from_json(s) for p in pieces for s in p["shards"]]
        write_wids(self.out_dir, self.split, shards, [m for p in pieces for m in p["md5s"]])
        return {}

    def abort(self) -> None:
        if self._tar is not None:
            self._tar.abort()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
