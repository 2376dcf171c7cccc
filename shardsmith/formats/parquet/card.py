"""What the dataset card says of Parquet shards: ``datasets``' ``parquet`` builder reads them, with
the features of the dataset's one schema (``joined.py``: every shard of a split carries it, a split
of fewer fields its part), written in the YAML ``datasets`` reads (``Features._to_yaml_list``'s
form: ``dtype``, ``list``, ``struct``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from shardsmith.core.manifest import resolve_inside
from shardsmith.errors import ShardsmithError
from shardsmith.kit.format import CardData

NOTE = ("Each shard is a Parquet file: pyarrow, Polars, DuckDB and Spark read them as they are (e.g. "
        "`pyarrow.parquet.read_table(\"path/to/this/folder/train-000000.parquet\")`), in the dataset's "
        "shuffled order, `__key__` naming each row's input. Every shard of a split has the same schema, so a "
        "glob reads them as one table (`polars.read_parquet(\"path/to/this/folder/train-*.parquet\")`).")


def parquet_card(out: Path, manifest: dict[str, Any]) -> CardData:
    features = None
    with contextlib.suppress(OSError, ValueError, ShardsmithError):  # shards not here (a cluster stage's stand-in)
        features = schema_features(shard_schema(out, manifest))
    notes = (NOTE,) if features is not None else \
        (NOTE, "`datasets` infers the features from the files (this card does not name them).")
    return CardData(builder="parquet", pattern="{split}-*.parquet", features=features, notes=notes)


def shard_schema(out: Path, manifest: dict[str, Any]) -> Any:
    """The dataset's schema: every split's shards' joined (``joined.py``; the shards of a split carry
    it already, those of splits with other fields its part; their footers only are read)."""
    import pyarrow.parquet as pq

    from shardsmith.formats.parquet.joined import dataset_schema

    schemas = {name: [pq.read_schema(resolve_inside(out, shard["path"])) for shard in split["shards"]]
               for name, split in manifest["splits"].items()}
    if not any(schemas.values()):
        raise ValueError("no shards")
    names = {name: [shard["path"] for shard in split["shards"]] for name, split in manifest["splits"].items()}
    return dataset_schema(schemas, names).remove_metadata()


def schema_features(schema: Any) -> list[dict[str, Any]] | None:
    """``dataset_info.features`` of these columns; None when one has a type this does not name."""
    out = []
    for field in schema:
        body = _body(field.type)
        if body is None:
            return None
        out.append({"name": field.name, **body})
    return out


def _body(t: Any) -> dict[str, Any] | None:
    import pyarrow as pa

    if pa.types.is_struct(t):
        fields = schema_features(pa.schema(list(t)))
        return None if fields is None else {"struct": fields}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _body(t.value_type)
        if inner is None:
            return None
        key = "list" if pa.types.is_list(t) else "large_list"
        # a scalar by its name, a struct by its fields, a list as itself (``datasets``' YAML)
        return {key: inner.get("dtype", inner.get("struct", inner))}
    name = _scalar(t)
    return None if name is None else {"dtype": name}


def _scalar(t: Any) -> str | None:
    import pyarrow as pa

    if pa.types.is_floating(t):
        return f"float{t.bit_width}"
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return "bool" if pa.types.is_boolean(t) else str(t)
    named = {pa.string(): "string", pa.large_string(): "large_string", pa.binary(): "binary",
             pa.large_binary(): "large_binary", pa.date32(): "date32", pa.date64(): "date64"}
    if t in named:
        return named[t]
    if pa.types.is_timestamp(t) and t.tz is None:
        return str(t)
    return None
