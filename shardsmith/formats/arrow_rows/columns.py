"""Samples into Arrow tables: each field a typed column, ``__key__`` the first, and one schema per shard.

The workers hand the writer samples (``rows.py``), read back typed, a row group at once: its
samples become one table, each field's column typed by pyarrow from all its values in the group
(ints and floats together: float64; a field missing from a sample: null there; bytes: binary;
lists and objects: lists and structs; a numpy array: a list, nested by its dimensions). A shard's
row groups are then given one schema (``unified``, ``cast_to``: the widening rules of ``schemas.py``,
a column null in one group takes the type it has in another, ints and floats ``float64``). Values
of types no one column holds (an int here, a string there) stop the run in one line naming the
field: Parquet has no column of both. The shards of a parquet dataset are then given one schema by
the same rules (``formats/parquet/joined.py``).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc  # noqa: F401 (pa.ipc)

from shardsmith.core.memory import no_gc
from shardsmith.errors import ShardsmithError
from shardsmith.formats.arrow_rows.rows import decoded_rows
from shardsmith.formats.arrow_rows.schemas import joined
from shardsmith.formats.arrow_rows.source_types import as_source
from shardsmith.kit.sample import KEY


def group_table(samples: list[bytes], *, where: str, types: pa.Schema | None = None) -> pa.Table:
    """One row group's table from the samples as the format's encoder made them (``rows.py``), in order
    (without the cyclic collector, which would walk the group's hundreds of thousands of values again
    and again: a third of the time); a field ``types`` names (the inputs' own) in its type there
    (``source_types.py``)."""
    with no_gc():
        return _group_table(samples, where=where, types=types)


def _group_table(samples: list[bytes], *, where: str, types: pa.Schema | None) -> pa.Table:
    keys, rows, arrays = decoded_rows(samples)
    names = dict.fromkeys(itertools.chain.from_iterable(rows))  # every row's fields, in the order they first come
    columns = {KEY: pa.array(keys, type=pa.string())}
    for name in names:
        values = [row.get(name) for row in rows]
        if name in arrays:  # (the other fields' values are as JSON reads them: none is an array)
            values = [_plain(v) for v in values]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
            raise mixed(name, where, exc) from None
        if types is not None and name in types.names:
            columns[name] = as_source(columns[name], types.field(name).type, name=name, where=where)
    return pa.table(columns)


def packed(table: pa.Table) -> pa.Buffer:
    """A finished row group kept until its shard is written: Arrow IPC, lz4-compressed (text keeps a
    third of its size or less), so that a writer holds a compressed shard and one row group decoded."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as out:
        out.write_table(table)
    return sink.getvalue()


def unpacked(buf: pa.Buffer) -> pa.Table:
    return pa.ipc.open_stream(buf).read_all()


def packed_schema(buf: pa.Buffer) -> pa.Schema:
    return pa.ipc.open_stream(buf).schema


def cast_to(table: pa.Table, schema: pa.Schema, *, where: str) -> pa.Table:
    """A row group in its shard's schema (``unified``): columns in its order, null where it has none."""
    if table.schema.equals(schema):
        return table
    arrays = []
    for field in schema:
        if field.name not in table.column_names:
            arrays.append(pa.nulls(len(table), field.type))
            continue
        try:
            arrays.append(table.column(field.name).cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise mixed(field.name, where, exc) from None
    return pa.Table.from_arrays(arrays, schema=schema)


def unified(schemas: list[pa.Schema], *, where: str, to: str) -> pa.Schema:
    """One schema for a shard's row groups (``schemas.joined``, promoting: the groups are cast to it)."""
    return joined(schemas, [f"row group {k + 1} of {where}" for k in range(len(schemas))], to=to, promote=True,
                  instead="make them one type (a --transform), or write --to webdataset")


def mixed(name: str, where: str, exc: Exception) -> ShardsmithError:
    """A field whose values no one column holds: the run stops, in one line."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ShardsmithError(f"--to parquet: field {name!r} in the rows of {where} holds values of types no one "
                           f"Parquet column holds ({reason}); make them one type (a --transform), or write "
                           f"--to webdataset")


def _plain(value: Any) -> Any:
    """A value pyarrow types: arrays of more than one dimension as nested lists, 0-d arrays as scalars."""
    if isinstance(value, np.ndarray) and value.ndim != 1:
        return value.tolist()
    return value
