"""The MDS writer: a split's samples, in output order, as ``mds/{split}/shard.{00000}.mds`` files, and
the split's ``mds/{split}/index.json`` once every shard is written (``finish_split``).

A shard is built in memory from the workers' payloads (``shard.py``), written under a temporary
name, fsynced and renamed whole, its sha256 taken from the bytes written. Its shard record keeps
what the index needs of it (``mds``: its columns and MDS's size limit), so the index is made from
the pieces of every writer of the split, whatever the number of workers or ranks: the same bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.formats.mds.shard import INDEX, build_shard, index_entry, index_json, shard_basename
from shardsmith.kit.rollover import Rollover, runs
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

_UNLIMITED = 1 << 62


# the folder of every split's folder: a name of its own, so that the format claims no folder of the
# user's (``MdsFormat.own_files``); ``StreamingDataset(local=OUT/mds, split=SPLIT)`` reads a split
SPLITS_DIR = "mds"


def split_dir(split: str) -> str:
    """The folder of a split's shards and index, relative to the dataset folder."""
    return f"{SPLITS_DIR}/{split}"


def index_name(split: str) -> str:
    """A split's ``index.json``, relative to the dataset folder (the manifest's ``mds_index``)."""
    return f"{split_dir(split)}/{INDEX}"


class MdsWriter(Writer):
    """Rolls over at ``shard_samples`` samples or ``shard_bytes`` of payload (about the shard's size)."""

    name = "mds"
    suffix = ".mds"
    keeps_batches = False  # every payload is copied (``bytes``) when handed over

    def __init__(self, *, out_dir: Path, split: str, shard_samples: int | None, shard_bytes: int,
                 part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.shard_samples = shard_samples
        self.shard_bytes = shard_bytes
        self._roller = self.rollover()
        self._runs: list[tuple[bytes, np.ndarray]] = []  # the shard being filled: payloads, their lengths

    def rollover(self) -> Rollover:
        return Rollover(max_weight=self.shard_bytes or _UNLIMITED, max_samples=self.shard_samples)

    def shard_name(self, index: int, suffix: str | None = None) -> str:
        return f"{split_dir(self.split)}/{shard_basename(index)}"

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        """Samples in output order: each run of a shard copied at once (the caller reuses ``payload``)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        ends = np.cumsum(lengths)
        for a, b, new in runs(self._roller.cut(self.weights(lengths, None)), len(lengths)):
            if new:
                self._flush()
            start = int(ends[a - 1]) if a else 0
            self._runs.append((bytes(payload[start:int(ends[b - 1]) if b else 0]), lengths[a:b]))

    def shard_full(self) -> None:
        self._flush()
        self._roller = self.rollover()

    def _flush(self) -> None:
        if not self._runs:
            return
        data = self._runs[0][0] if len(self._runs) == 1 else b"".join(r[0] for r in self._runs)
        lengths = np.concatenate([r[1] for r in self._runs])
        index = self.next_index()
        rel = self.shard_name(index)
        path = self.out_dir / rel
        columns, buffers = build_shard(data, lengths, size_limit=self.shard_bytes, where=str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffers)
        sha = hashlib.sha256()
        for buffer in buffers:
            sha.update(buffer)
        self.shards.append(ShardRecord(path=rel, samples=len(lengths), bytes=sum(len(b) for b in buffers),
                                       sha256=sha.hexdigest(), extra={"mds": {"columns": [list(c) for c in columns]}}))
        self.md5s.append(None)
        self._runs = []

    def close(self) -> list[ShardRecord]:
        self._flush()
        return self.shards

    def abort(self) -> None:
        self._runs = []

    def finish_split(self, pieces: list[dict[str, Any]]) -> dict[str, Any]:
        """The split's ``index.json``, over every writer's shards (an empty split: no shards)."""
        entries = [index_entry(basename=Path(s["path"]).name, samples=s["samples"], nbytes=s["bytes"],
                               columns=tuple((n, e) for n, e in s["mds"]["columns"]), size_limit=self.shard_bytes)
                   for p in pieces for s in p["shards"]]
        path = self.out_dir / index_name(self.split)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, index_json(entries))
        return {}
