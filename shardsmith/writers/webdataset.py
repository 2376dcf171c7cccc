"""WebDataset tar shards ``{split}-{000000}.tar``, a per-shard offset index, and a wids shard index.

Samples arrive as complete tar members (headers, data and padding built by the workers, see
``shardsmith.tarfmt``), so writing a shard is appending bytes. Each shard gets
``{split}-{000000}.offsets.npy`` (int64, n+1: where each sample's first header starts, then where
the end-of-archive blocks start) for O(1) random access, and the split gets ``{split}.wids.json``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import orjson

from shardsmith.fsutil import HashingFile, atomic_write_bytes
from shardsmith.tarfmt import end_of_archive
from shardsmith.writers.base import ShardRecord, Writer


def _closed_size(size: int) -> int:
    """A shard's size once closed: two zero blocks, padded to whole 10240-byte records."""
    return -(-(size + 1024) // 10240) * 10240


class TarWriter(Writer):
    """Rolls tar shards over at ``shard_samples`` samples or ``shard_bytes`` bytes, whichever comes first."""

    name = "webdataset"
    suffix = ".tar"

    def __init__(self, *, out_dir: Path, split: str, shard_samples: int | None, shard_bytes: int,
                 wids_md5: bool = False) -> None:
        super().__init__(out_dir=out_dir, split=split)
        self.shard_samples = shard_samples or (1 << 62)
        self.shard_bytes = shard_bytes
        self.wids_md5 = wids_md5
        self._tar: HashingFile | None = None
        self._starts: list[int] = []
        self._md5s: list[str | None] = []

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        """Append whole samples; a shard never splits a sample."""
        pos = 0
        run_start = 0
        for n in np.asarray(lengths, dtype=np.int64).tolist():
            if self._tar is not None and self._starts and (
                    len(self._starts) >= self.shard_samples
                    or _closed_size(self._tar.bytes + (pos - run_start) + n) > self.shard_bytes):
                self._tar.write(payload[run_start:pos])
                run_start = pos
                self._roll()
            if self._tar is None:
                self._tar = HashingFile(self.out_dir / self.shard_name(len(self.shards)), md5=self.wids_md5)
            self._starts.append(self._tar.bytes + (pos - run_start))
            pos += n
        if self._tar is not None and pos > run_start:
            self._tar.write(payload[run_start:pos])

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
