"""One Lance schema over shards that typed their columns each from its own rows, and where each
shard's columns sit in it.

A Lance dataset has one schema, and a fragment's data file says which of the schema's fields it
holds (``DataFile.fields``: the ids of its leaf columns); a field a fragment's file lacks reads as
null there. So the shards are not rewritten: the dataset's schema is their fields joined, in the
order they first appear, shard after shard (``joined``, by the rules every format of typed rows
shares: ``formats/arrow_rows/schemas.py``): a column null in one shard (all its values missing)
takes the type it has in another, a struct the keys any shard's has; a leaf of two other types (an
int here, a float or a string there) stops the run in one line, as no file is cast. Lance numbers a schema's
fields depth first, parents before children (``leaf_ids``; the writer checks the numbering against
pylance's for every shard it writes), and a shard's columns are named by their paths
(``["meta", "b", "item"]``), so their ids in the dataset's schema follow."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from shardsmith.errors import ShardsmithError
from shardsmith.formats.arrow_rows.schemas import children
from shardsmith.formats.arrow_rows.schemas import joined as rows_joined

Path = tuple[str, ...]


def leaf_ids(schema: pa.Schema) -> dict[Path, int]:
    """Each leaf column's id, as Lance numbers the schema's fields (depth first, parents first)."""
    ids: dict[Path, int] = {}
    counter = [0]

    def walk(field: pa.Field, path: Path) -> None:
        here = counter[0]
        counter[0] += 1
        kids = children(field.type)
        if not kids:
            ids[path] = here
        for child in kids:
            walk(child, (*path, child.name))

    for field in schema:
        walk(field, (field.name,))
    return ids


# Lance picks each string column's compression itself, and for text it picks FSST, whose symbol
# table is trained on a random sample of the page: the same rows gave files of other bytes (and
# sizes) run after run. A field's metadata names its compression instead: zstd for text, none for
# bytes (images are compressed already), which give the same bytes every time.
COMPRESSION = b"lance-encoding:compression"


def pinned(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every text and bytes field's compression named (see ``COMPRESSION``)."""
    return pa.schema([_pinned(f) for f in schema], metadata=schema.metadata)


def _pinned(f: pa.Field) -> pa.Field:
    t = f.type
    if pa.types.is_struct(t):
        return f.with_type(pa.struct([_pinned(c) for c in children(t)]))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        make = pa.large_list if pa.types.is_large_list(t) else pa.list_
        return f.with_type(make(_pinned(t.value_field)))
    if pa.types.is_fixed_size_list(t):
        return f.with_type(pa.list_(_pinned(t.value_field), t.list_size))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return f.with_metadata({**(f.metadata or {}), COMPRESSION: b"zstd"})
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return f.with_metadata({**(f.metadata or {}), COMPRESSION: b"none"})
    return f


def joined(schemas: list[pa.Schema], names: list[str]) -> pa.Schema:
    """The dataset's schema: every shard's fields, joined without promotion (``arrow_rows/schemas.py``:
    a fragment's file is not rewritten, its columns are read as stored); ``names`` name the shards
    in the one line a conflict stops the run with."""
    return rows_joined(schemas, [f"shard {n}" for n in names], to="lance", promote=False,
                       instead="make them one type (a --transform), or write --to parquet, whose shards "
                           "take one type (ints and floats: float64)")


def placed(columns: list[list[str]], file_schema: pa.Schema, dataset: pa.Schema, *, shard: str
           ) -> tuple[list[int], list[int]]:
    """A shard file's columns (their paths, in the file's order) as ``DataFile`` lists them: the
    dataset's field ids and the file's column indexes. A top-level null column whose field is of
    another type in the dataset is left out: it reads as null. A null nested in a list or struct
    cannot be (the run stops in one line)."""
    ids, kinds = leaf_ids(dataset), _leaf_types(dataset)
    mine = _leaf_types(file_schema)
    fields, indexes = [], []
    for k, path in enumerate(map(tuple, columns)):
        if pa.types.is_null(mine[path]) and not (path in kinds and pa.types.is_null(kinds[path])):
            if len(path) > 1:  # its list's or struct's levels are in that column: left out, they would be lost
                raise ShardsmithError(f"--to lance: field {'.'.join(path[:-1])!r} holds only empty lists or nulls "
                                      f"in the rows of shard {shard}, and values of another type in other shards; "
                                      f"a Lance dataset has one type per column: make the shards larger "
                                      f"(--shard-samples), or write --to parquet")
            continue
        fields.append(ids[path])
        indexes.append(k)
    return fields, indexes


def _leaf_types(schema: pa.Schema) -> dict[Path, Any]:
    out: dict[Path, Any] = {}

    def walk(field: pa.Field, path: Path) -> None:
        kids = children(field.type)
        if not kids:
            out[path] = field.type
        for child in kids:
            walk(child, (*path, child.name))

    for field in schema:
        walk(field, (field.name,))
    return out
