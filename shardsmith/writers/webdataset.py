"""WebDataset tar shards ``{split}-{000000}.tar``, a per-shard offset index, and a wids shard index.

Samples arrive as complete tar members (headers, data and padding built by the workers, see
``shardsmith.tarfmt``), so writing a shard is appending bytes. Each shard gets
``{split}-{000000}.offsets.npy`` (int64, n+1: where each sample's first header starts, then where
the end-of-archive blocks start) for O(1) random access, and the split gets ``{split}.wids.json``.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from shardsmith.errors import DataError
from shardsmith.fsutil import HashingFile, atomic_write_bytes
from shardsmith.tarfmt import BLOCK, end_of_archive, padding
from shardsmith.writers.base import ShardRecord, Writer

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


def _closed_size(size: int) -> int:
    """A shard's size once closed: two zero blocks, padded to whole 10240-byte records."""
    return -(-(size + 1024) // 10240) * 10240


class TarWriter(Writer):
    """Rolls tar shards over at ``shard_samples`` samples or ``shard_bytes`` bytes, whichever comes first."""

    name = "webdataset"
    suffix = ".tar"

    def __init__(self, *, out_dir: Path, split: str, shard_samples: int | None, shard_bytes: int,
                 wids_md5: bool = False, sources: list[str] | None = None) -> None:
        """``sources``: input paths by file index, when samples carry ``SourceRef``s to expand."""
        super().__init__(out_dir=out_dir, split=split)
        self.sources = sources
        self.shard_samples = shard_samples or (1 << 62)
        self.shard_bytes = shard_bytes
        self.wids_md5 = wids_md5
        self._tar: HashingFile | None = None
        self._starts: list[int] = []
        self._md5s: list[str | None] = []

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        """Append whole samples; a shard never splits a sample."""
        if self.sources is not None:
            self._write_referenced(lengths, payload)
            return
        pos = 0
        run_start = 0
        for n in np.asarray(lengths, dtype=np.int64).tolist():
            if self._full(pos - run_start + n):
                self._tar.write(payload[run_start:pos])  # type: ignore[union-attr]
                run_start = pos
                self._roll()
            self._begin_sample(run_start, pos)
            pos += n
        if self._tar is not None and pos > run_start:
            self._tar.write(payload[run_start:pos])

    def _write_referenced(self, lengths: np.ndarray, payload: memoryview) -> None:
        """Samples whose first member's data is a SourceRef: copy that data from the input file.

        Pieces are gathered into blocks of a few MB before they go to the writing thread: one
        hand-over per block, not three per sample.
        """
        assert self.sources is not None
        pos = 0
        pieces: list[bytes | memoryview] = []
        pending = 0
        for n in np.asarray(lengths, dtype=np.int64).tolist():
            magic, index, size = _REF.unpack_from(payload, pos + BLOCK)
            if magic != REF_MAGIC:
                raise AssertionError("sample without the SourceRef the writer expects")
            true_size = n - _REF.size + size + len(padding(size))
            if self._full(pending + true_size):
                self._flush(pieces)
                pending = 0
                self._roll()
            self._begin_sample(-pending, 0)
            path = self.sources[index]
            with open(path, "rb") as fh:
                data = fh.read(size + 1)
            if len(data) != size:
                raise DataError(file=path, reason=f"changed while converting: {len(data)} bytes, was {size}")
            pieces += [payload[pos:pos + BLOCK], data, padding(size), payload[pos + BLOCK + _REF.size:pos + n]]
            pending += true_size
            pos += n
            if pending >= 4 << 20:
                self._flush(pieces)
                pending = 0
        self._flush(pieces)

    def _flush(self, pieces: list[bytes | memoryview]) -> None:
        if pieces:
            self._tar.write(b"".join(pieces))  # type: ignore[union-attr]
            pieces.clear()

    def _full(self, next_sample: int) -> bool:
        """Whether ``next_sample`` more bytes (beyond those already written) must start a new shard."""
        if self._tar is None or not self._starts:
            return False
        return len(self._starts) >= self.shard_samples or _closed_size(self._tar.bytes + next_sample) > self.shard_bytes

    def _begin_sample(self, run_start: int, pos: int) -> None:
        if self._tar is None:
            self._tar = HashingFile(self.out_dir / self.shard_name(len(self.shards)), md5=self.wids_md5)
        self._starts.append(self._tar.bytes + (pos - run_start))

    def _roll(self) -> None:
        tar = self._tar
        assert tar is not None
        end = tar.bytes
        tar.write(end_of_archive(end))
        sha = tar.commit()
        offsets = np.asarray([*self._starts, end], dtype=np.int64)
        buf = io.BytesIO()
        np.save(buf, offsets, allow_pickle=False)
        idx = HashingFile(self.out_dir / self.shard_name(len(self.shards), ".offsets.npy"))
        idx.write(buf.getvalue())
        idx_sha = idx.commit()
        self.shards.append(ShardRecord(
            path=tar.path.name, samples=len(self._starts), bytes=tar.bytes, sha256=sha,
            extra={"index": {"path": idx.path.name, "bytes": idx.bytes, "sha256": idx_sha}}))
        self._md5s.append(tar.md5)
        self._tar, self._starts = None, []

    def close(self) -> list[ShardRecord]:
        if self._tar is not None:
            self._roll()
        self._write_wids()
        return self.shards

    def _write_wids(self) -> None:
        """``{split}.wids.json``: the shard list wids' ShardListDataset reads (urls relative to it)."""
        shardlist = []
        for shard, md5 in zip(self.shards, self._md5s):
            entry: dict = {"url": shard.path, "nsamples": shard.samples, "filesize": shard.bytes}
            if md5:
                entry["md5sum"] = md5
            shardlist.append(entry)
        index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": self.split, "shardlist": shardlist}
        atomic_write_bytes(self.out_dir / f"{self.split}.wids.json", orjson.dumps(index, option=orjson.OPT_INDENT_2))

    def abort(self) -> None:
        if self._tar is not None:
            self._tar.abort()
