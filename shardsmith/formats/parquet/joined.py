"""One Arrow schema for every shard of a Parquet dataset, so that a reader of the whole folder
(``pyarrow.dataset.dataset(OUT)``, DuckDB's ``read_parquet('OUT/*.parquet')``, Polars'
``scan_parquet``) reads its files as one table, with no option to unify them.

A writer types a shard's columns from that shard's rows alone (``arrow_rows/grouped.py``): a field
null in every row of one shard is null-typed there, a field of ints in one shard and of floats in
another is ``int64`` here and ``float64`` there, a field some shard's rows all lack is not in its
file. Nothing knows the other shards' types while a shard is written (the writers of a split cut
theirs at once, each its range), so once every split's shards are written (``Writer.join_shards``,
before any split finishes) their footers' schemas are joined by the rules of every format of typed
rows (``arrow_rows/schemas.py``): null takes the other type, structs the keys of both, ints and
floats ``float64``; two types no column holds stop the run in one line. The dataset's schema is
joined over every split's shards in order, split after split; a split's schema is the dataset's
fields that its shards have (a split never gains a column it has no value of), so the splits agree
on every field they share. A shard whose schema differs is rewritten in it, row group by row group
(its row groups and the writer's settings kept), and renamed over the old file. The schemas
follow from the shards' contents alone, as do the shards: the same files for any ``--workers``,
``--memory`` or ranks. Most datasets' shards agree already, and none is rewritten.

A cluster stage into object storage finishes from stand-ins of the shards (sparse files of their
sizes): where the writers' records' digests of their schemas (``writer.schema_digest``) all agree,
nothing is read (a rerun after a finalize rewrote shards reads them all); else each shard's footer is brought into its stand-in first (``kit/shard_bytes.py``: ranged reads
of its object, 64 KiB from its end, more if its footer is longer), and a shard that differs is brought
whole and rewritten by the same code, then uploaded over its object, so the bucket holds a local run's
bytes. Where no footer can be read and nothing brings one, each record's digest of its schema
(``writer.schema_digest``) says whether the shards agree; shards that differ stop the run in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.errors import ShardsmithError
from shardsmith.formats.arrow_rows.columns import cast_to
from shardsmith.formats.arrow_rows.schemas import joined
from shardsmith.kit.shard_bytes import bring, records_as_written, remote
from shardsmith.kit.writer import Replaced, ShardRecord

INSTEAD = "make them one type (a --transform), or write --to webdataset"
TAIL = 64 << 10  # the first ranged read of a shard not here: its footer, mostly
END = 8  # a Parquet file ends in its footer's length (4 bytes, little-endian) and b"PAR1"


def dataset_schema(schemas: dict[str, list[Any]], names: dict[str, list[str]]) -> Any:
    """The schema of every shard of every split, joined (``names``: each shard's, for the error)."""
    return joined([s for split in schemas for s in schemas[split]], [f"shard {n}" for split in names
                                                                     for n in names[split]],
                  to="parquet", promote=True, instead=INSTEAD)


def split_schema(dataset: Any, shards: list[Any]) -> Any:
    """A split's schema: the dataset's fields that its shards have, in the dataset's order."""
    import pyarrow as pa

    mine = {f.name for s in shards for f in s}
    return pa.schema([f for f in dataset if f.name in mine])


def join_shards(out_dir: Path, splits: dict[str, list[ShardRecord]], *, replaced: Replaced,
                rewrite: Any) -> None:
    """Every shard of ``splits`` in its split's schema (the module says which): those whose footer
    says otherwise rewritten, ``rewrite(record, schema, tables, tell)`` writing a shard's file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    digests = {r.extra.get("schema") for records in splits.values() for r in records}
    if remote() and records_as_written() and len(digests) <= 1:
        return  # stand-ins whose schemas agree (their writers' records say so): left as written, nothing fetched
    try:
        for record in (r for records in splits.values() for r in records):
            _footer_here(out_dir, record)
        own = {split: [pq.read_schema(out_dir / r.path).remove_metadata() for r in records]
               for split, records in splits.items()}
    except (OSError, pa.ArrowException):  # shards not here (a cluster stage into object storage)
        _agree_unread(splits)
        return
    dataset = dataset_schema(own, {split: [r.path for r in records] for split, records in splits.items()})
    for split, records in splits.items():
        schema = split_schema(dataset, own[split])
        for k, (record, mine) in enumerate(zip(records, own[split])):
            if mine.equals(schema):
                continue
            where = f"shard {record.path}"

            def tables(path: Path = out_dir / record.path, schema: Any = schema, where: str = where,
                       record: ShardRecord = record) -> Any:
                bring(record.path, 0, record.bytes)  # (a stand-in: the whole object, read only to be rewritten)
                with pq.ParquetFile(path) as source:
                    for g in range(source.num_row_groups):
                        yield cast_to(source.read_row_group(g), schema, where=where)

            def tell(new: ShardRecord, split: str = split, k: int = k) -> None:
                replaced(split, k, new)

            rewrite(record, schema, tables(), tell)


def _footer_here(out_dir: Path, record: ShardRecord) -> None:
    """A stand-in's footer brought into it (nothing where the files are whole)."""
    if not remote() or record.bytes < END:
        return
    size = record.bytes
    bring(record.path, max(0, size - TAIL), size)
    with open(out_dir / record.path, "rb") as fh:
        fh.seek(size - END)
        start = size - END - int.from_bytes(fh.read(4), "little")
    bring(record.path, max(0, start), max(0, size - TAIL))


def _agree_unread(splits: dict[str, list[ShardRecord]]) -> None:
    """Shards whose files are not here, left as written when their schemas agree (their records'
    digests), else refused: they could not be given one schema."""
    seen = {r.extra.get("schema") for records in splits.values() for r in records}
    if len(seen) > 1:
        raise ShardsmithError("--to parquet: the shards' column types differ (a field null or missing in some "
                              "shards, or ints in one and floats in another), and a cluster run into object "
                              "storage finishes without the shards' bytes to give them one schema: write to a "
                              "shared folder (-o PATH) and upload it, or make the types agree (a --transform)")
