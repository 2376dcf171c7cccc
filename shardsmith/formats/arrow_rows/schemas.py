"""One Arrow schema over tables that each typed their columns from their own rows: the row groups of
a shard (``columns.py``), the shards of a split and the splits of a dataset (parquet's
``formats/parquet/joined.py``), a Lance split's fragments (``formats/lance/schema.py``). The
widening rules live here, once, so that every place agrees on what a column of two types becomes.

``joined`` takes the fields in the order they first appear, table after table, and joins a field's
types: the same type stays; ``null`` (every value missing) takes the other; two structs take the
children of both (each joined the same way), two lists (of one kind) the join of their items.
Other leaves of two types are *promoted* where the tables will be cast to the result (parquet:
pyarrow's permissive promotion of the two, ``pa.unify_schemas``: ints of two widths the wider,
ints and floats ``float64``, text and bytes ``binary``); a format whose files are not rewritten
(Lance: a fragment's column is read as it is stored) joins without promotion. Leaves no one column
holds (an int and a string; a list and a scalar) stop the run in one line naming the field, and
where each type came from."""

from __future__ import annotations

import pyarrow as pa

from shardsmith.errors import ShardsmithError

Path = tuple[str, ...]


def children(t: pa.DataType) -> list[pa.Field]:
    """A nested type's child fields (a struct's, or a list's one item); none for a leaf."""
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [t.value_field]
    return []


def joined(schemas: list[pa.Schema], names: list[str], *, to: str, promote: bool, instead: str) -> pa.Schema:
    """The schema that holds every table of ``schemas`` (the module says how); ``names`` name the
    tables (``"shard train-000003.parquet"``) in the one line a conflict stops the run with, which
    ends with ``instead`` (what the user can do); ``to`` names the format (``--to parquet``)."""
    fields: dict[str, pa.Field] = {}
    origin: dict[str, str] = {}  # where a field's type was first seen
    for schema, name in zip(schemas, names):
        for field in schema:
            if field.name in fields:
                fields[field.name] = _Join(to=to, promote=promote, instead=instead, first=origin[field.name],
                                           then=name).field(fields[field.name], field, (field.name,))
            else:
                fields[field.name], origin[field.name] = field, name
    return pa.schema(list(fields.values()))


class _Join:
    """Two fields joined, nested ones child by child; ``first``/``then`` name where each came from."""

    def __init__(self, *, to: str, promote: bool, instead: str, first: str, then: str) -> None:
        self.to, self.promote, self.instead, self.first, self.then = to, promote, instead, first, then

    def field(self, a: pa.Field, b: pa.Field, path: Path) -> pa.Field:
        if pa.types.is_null(b.type) or a.type.equals(b.type):
            return a
        if pa.types.is_null(a.type):
            return b.with_name(a.name)
        if pa.types.is_struct(a.type) and pa.types.is_struct(b.type):
            kids = {c.name: c for c in children(a.type)}
            for c in children(b.type):
                kids[c.name] = self.field(kids[c.name], c, (*path, c.name)) if c.name in kids else c
            return pa.field(a.name, pa.struct(list(kids.values())), nullable=True)
        if type(a.type) is type(b.type) and children(a.type) and not pa.types.is_fixed_size_list(a.type):
            item = self.field(a.type.value_field, b.type.value_field, (*path, "item"))
            make = pa.large_list if pa.types.is_large_list(a.type) else pa.list_
            return pa.field(a.name, make(item), nullable=True)
        if self.promote and not children(a.type) and not children(b.type):
            try:
                both = pa.unify_schemas([pa.schema([a]), pa.schema([b.with_name(a.name)])],
                                        promote_options="permissive")
                return both.field(0)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                pass
        raise ShardsmithError(f"--to {self.to}: field {'.'.join(path)!r} is {a.type} in the rows of {self.first} and "
                              f"{b.type} in those of {self.then}: a column holds one type; {self.instead}")
