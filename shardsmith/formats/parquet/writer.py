"""Parquet shards: ``{split}-{000000}.parquet``, one file each, row groups cut by ``row_group_rows``
and ``row_group_bytes``, written with fixed settings so that the same samples give the same bytes.

A shard's row groups are kept in memory (lz4-compressed Arrow, ``columns.packed``) so that its
columns take one type from all its rows, then written whole to a temporary file and renamed into place (a
shard a killed run left half-made is never under its name). Settings (``SETTINGS``): zstd at level
3 (fast to read, about as small as gzip), dictionary encoding, statistics for every column (what
query engines skip row groups by), format version 2.6, the Arrow schema stored (pyarrow and
``datasets`` read the exact types back); the footer's ``created_by`` names the pyarrow version,
never a time. Row groups and shards are cut by the samples' encoded sizes (``kit/rollover.py``),
which depend on the samples alone: the same files for any ``--workers``, ``--memory`` or ranks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from shardsmith.formats.parquet.columns import cast_to, group_table, packed, packed_schema, unified, unpacked
from shardsmith.kit.rollover import UNLIMITED, Rollover
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

SUFFIX = ".parquet"
SETTINGS: dict[str, Any] = {"compression": "zstd", "compression_level": 3, "use_dictionary": True,
                            "write_statistics": True, "version": "2.6", "store_schema": True}


class ParquetShardWriter(Writer):
    """Rolls over by ``shard_samples``/``shard_bytes`` and, within a shard, cuts row groups."""

    name = "parquet"
    suffix = SUFFIX
    keeps_batches: ClassVar[bool] = False  # every sample is decoded as it comes

    def __init__(self, *, out_dir: Path, split: str, shard_samples: int | None, shard_bytes: int | None,
                 group_rows: int | None, group_bytes: int | None, part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.shard_samples, self.shard_bytes = shard_samples, shard_bytes
        self.group_rows, self.group_bytes = group_rows, group_bytes
        self._shard = self.rollover()
        self._group = self._group_rollover()
        self._rows: list[bytes] = []  # the row group being filled
        self._groups: list[Any] = []  # the shard's finished row groups, packed (``columns.packed``)
        self._count = 0

    def rollover(self) -> Rollover:
        return Rollover(max_weight=self.shard_bytes or UNLIMITED, max_samples=self.shard_samples)

    def _group_rollover(self) -> Rollover:
        return Rollover(max_weight=self.group_bytes or UNLIMITED, max_samples=self.group_rows)

    def preload(self) -> None:
        import pyarrow.parquet  # noqa: F401 (imported once, in the parent)

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        bounds = [0, *self._shard.cut(lengths), len(lengths)]
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            if k:  # a shard ends before sample a
                self._flush()
            groups = set(self._group.cut(lengths[a:b]))
            for i in range(a, b):
                if i - a in groups:
                    self._end_group()
                self._rows.append(bytes(payload[starts[i]:starts[i + 1]]))
                self._count += 1

    def shard_full(self) -> None:
        self._flush()
        self._shard = self.rollover()

    def _end_group(self) -> None:
        if self._rows:
            self._groups.append(packed(group_table(self._rows, where=f"shard {self.shard_name(self.next_index())}")))
            self._rows = []

    def _flush(self) -> None:
        self._end_group()
        self._group = self._group_rollover()
        if not self._groups:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        name = self.shard_name(self.next_index())
        where = f"shard {name}"
        schema = unified([packed_schema(g) for g in self._groups], where=where)
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, schema, **SETTINGS) as pw:
            while self._groups:
                table = cast_to(unpacked(self._groups.pop(0)), schema, where=where)
                pw.write_table(table, row_group_size=max(1, len(table)))
        data = memoryview(sink.getvalue())
        tmp = self.out_dir / f".{name}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.out_dir / name)
        self.shards.append(ShardRecord(path=name, samples=self._count, bytes=len(data),
                                       sha256=hashlib.sha256(data).hexdigest()))
        self.md5s.append(None)
        self._count = 0

    def close(self) -> list[ShardRecord]:
        self._flush()
        return self.shards

    def abort(self) -> None:
        self._rows, self._groups, self._count = [], [], 0
