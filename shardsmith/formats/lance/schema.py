"""One Lance schema over shards that typed their columns each from its own rows, and where each
shard's columns sit in it.

A Lance dataset has one schema, and a fragment's data file says which of the schema's fields it
holds (``DataFile.fields``: the ids of its leaf columns); a field a fragment's file lacks reads as
null there. So the shards are not rewritten: the dataset's schema is their fields joined, in the
order they first appear, shard after shard (``joined``): a column null in one shard (all its
values missing) takes the type it has in another, a struct the keys any shard's has; a leaf of
two other types (an int here, a string there) stops the run in one line. Lance numbers a schema's
fields depth first, parents before children (``leaf_ids``; the writer checks the numbering against
pylance's for every shard it writes), and a shard's columns are named by their paths
(``["meta", "b", "item"]``), so their ids in the dataset's schema follow."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from shardsmith.errors import ShardsmithError

Path = tuple[str, ...]


def leaf_ids(schema: pa.Schema) -> dict[Path, int]:
    """Each leaf column's id, as Lance numbers the schema's fields (depth first, parents first)."""
    ids: dict[Path, int] = {}
    counter = [0]

    def walk(field: pa.Field, path: Path) -> None:
        here = counter[0]
        counter[0] += 1
        children = _children(field.type)
        if not children:
            ids[path] = here
        for child in children:
            walk(child, (*path, child.name))

    for field in schema:
        walk(field, (field.name,))
    return ids


def _children(t: pa.DataType) -> list[pa.Field]:
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [t.value_field]
    return []


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
        return f.with_type(pa.struct([_pinned(c) for c in _children(t)]))
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
    """The dataset's schema: every shard's fields, joined (the module says how); ``names`` name the
    shards in the one line a conflict stops the run with."""
    fields: dict[str, pa.Field] = {}
    for schema, name in zip(schemas, names):
        for field in schema:
            fields[field.name] = _join(fields[field.name], field, (field.name,), name) if field.name in fields \
                else field
    return pa.schema(list(fields.values()))


def _join(a: pa.Field, b: pa.Field, path: Path, shard: str) -> pa.Field:
    if pa.types.is_null(b.type) or a.type.equals(b.type):
        return a
    if pa.types.is_null(a.type):
        return b
    if pa.types.is_struct(a.type) and pa.types.is_struct(b.type):
        children = {c.name: c for c in _children(a.type)}
        for c in _children(b.type):
            children[c.name] = _join(children[c.name], c, (*path, c.name), shard) if c.name in children else c
        return pa.field(a.name, pa.struct(list(children.values())), nullable=True)
    if type(a.type) is type(b.type) and _children(a.type) and not pa.types.is_fixed_size_list(a.type):
        item = _join(a.type.value_field, b.type.value_field, (*path, "item"), shard)
        make = pa.large_list if pa.types.is_large_list(a.type) else pa.list_
        return pa.field(a.name, make(item), nullable=True)
    raise ShardsmithError(f"--to lance: field {'.'.join(path)!r} is {a.type} in the rows of one shard and {b.type} "
                          f"in those of shard {shard}: a Lance dataset has one type per column; make them one type "
                          f"(a --transform), or write --to parquet")


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
        children = _children(field.type)
        if not children:
            out[path] = field.type
        for child in children:
            walk(child, (*path, child.name))

    for field in schema:
        walk(field, (field.name,))
    return out
