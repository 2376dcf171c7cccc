"""A column typed again as the input stored it: a Parquet input's column of ``int32``, ``float32``,
timestamps, dates, decimals or dictionaries reaches the writer as JSON holds its values (an int, a
float, a timestamp's or decimal's text: ``kit/sample.py``'s ``framed``), and ``pa.array`` types it
from them (``int64``, ``float64``, ``string``). The source's own types (``Reader.arrow_types``, the
write job's ``schema``) are given back by a cast of that column, which parses the text as Arrow
reads it: the same values in the input's type. Nested columns are cast child by child, a child's
values under a null struct or list nulled first (``pa.array`` gives them as empty text there, which
no timestamp parses)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from shardsmith.errors import ShardsmithError


def as_source(column: pa.Array, t: pa.DataType, *, name: str, where: str) -> pa.Array:
    """``column`` (typed from its values) in the input's type ``t``; one line if its values are not
    of it (an error: the values came from a column of that type)."""
    try:
        return _cast(column, t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ShardsmithError(f"--to parquet: field {name!r} in the rows of {where} does not read back as the "
                              f"input's {t} ({reason})") from None


def _cast(a: pa.Array, t: pa.DataType) -> pa.Array:
    if a.type.equals(t):
        return a
    if pa.types.is_null(a.type):
        return pa.nulls(len(a), t)
    if pa.types.is_struct(t) and pa.types.is_struct(a.type):
        valid = a.is_valid()
        kids = []
        for i in range(t.num_fields):
            f = t.field(i)
            if a.type.get_field_index(f.name) < 0:
                kids.append(pa.nulls(len(a), f.type))
                continue
            child = a.field(f.name)  # (the child's values, without the struct's nulls)
            kids.append(_cast(pc.if_else(valid, child, pa.scalar(None, child.type)), f.type))
        return pa.StructArray.from_arrays(kids, fields=list(t), mask=pc.invert(valid))
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and (pa.types.is_list(a.type) or
                                                                pa.types.is_large_list(a.type)):
        items = _cast(a.values, t.value_type)
        offsets = a.offsets if pa.types.is_large_list(t) == pa.types.is_large_list(a.type) else \
            a.offsets.cast(pa.int64() if pa.types.is_large_list(t) else pa.int32())
        make = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        return make.from_arrays(offsets, items, type=t, mask=a.is_null())
    return a.cast(t)
