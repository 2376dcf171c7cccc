"""Parquet shards: ``{split}-{000000}.parquet``, one file each, row groups cut by ``row_group_rows``
and ``row_group_bytes``, written with fixed settings so that the same samples give the same bytes.

A shard's row groups are kept in memory (lz4-compressed Arrow: ``arrow_rows/grouped.py``) so that its
columns take one type from all its rows, then written whole to a temporary file and renamed into place (a
shard a killed run left half-made is never under its name). Settings (``SETTINGS``): zstd at level
3 (fast to read, about as small as gzip), dictionary encoding, statistics for every column (what
query engines skip row groups by), format version 2.6, the Arrow schema stored (pyarrow and
``datasets`` read the exact types back); the footer's ``created_by`` names the pyarrow version,
never a time. Row groups and shards are cut by the samples' encoded sizes (``kit/rollover.py``),
which depend on the samples alone: the same files for any ``--workers``, ``--memory`` or ranks.
Once every split's shards are written, those whose schema differs from the dataset's are rewritten
in it (``joined.py``), so that every file of the dataset carries one schema."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from shardsmith.formats.arrow_rows.grouped import GroupedRowsWriter
from shardsmith.kit.writer import Replaced, ShardRecord

SUFFIX = ".parquet"


def schema_digest(schema: Any) -> str:
    """A short digest of the Arrow schema a shard is written in (its record's ``schema``): what tells
    shards of differing types apart where their files cannot be read (``joined.py``)."""
    return hashlib.sha256(schema.remove_metadata().serialize().to_pybytes()).hexdigest()[:16]
SETTINGS: dict[str, Any] = {"compression": "zstd", "compression_level": 3, "use_dictionary": True,
                            "write_statistics": True, "version": "2.6", "store_schema": True}


class ParquetShardWriter(GroupedRowsWriter):
    """Each shard one Parquet file, each group of rows one row group."""

    name = "parquet"
    suffix = SUFFIX

    def preload(self) -> None:
        import pyarrow.parquet  # noqa: F401 (imported once, in the parent)

    def write_shard(self, name: str, schema: Any, tables: Iterator[Any], rows: int) -> ShardRecord:
        return self._written(name, schema, tables, rows)

    def join_shards(self, splits: dict[str, list[ShardRecord]], *, replaced: Replaced) -> None:
        """Every shard of the dataset in its split's one schema (``joined.py``): a shard whose footer says
        otherwise rewritten in it."""
        from shardsmith.formats.parquet.joined import join_shards

        def rewrite(record: ShardRecord, schema: Any, tables: Iterator[Any], tell: Any) -> None:
            self._written(record.path, schema, tables, record.samples, before=tell)

        join_shards(self.out_dir, splits, replaced=replaced, rewrite=rewrite)

    def _written(self, name: str, schema: Any, tables: Iterator[Any], rows: int,
                 before: Callable[[ShardRecord], None] | None = None) -> ShardRecord:
        """Shard ``name`` written whole to a temporary file, then renamed into place (``before``
        told of its record first); its record."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, schema, **SETTINGS) as pw:
            for table in tables:
                pw.write_table(table, row_group_size=max(1, len(table)))
        data = memoryview(sink.getvalue())
        tmp = self.out_dir / f".{name}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        record = ShardRecord(path=name, samples=rows, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                             extra={"schema": schema_digest(schema)})
        if before is not None:
            before(record)
        os.replace(tmp, self.out_dir / name)
        return record
