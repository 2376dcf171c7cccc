"""The fields a Parquet file gives: Arrow types walked into ``_Leaf``s (structs dotted, one list
level a ragged group), collected in a ``_Layout`` that files must share, and how two layouts differ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema, Field

ROWS_COUNTER = "n_rows"  # the counter of the long layout: rows (hits, pulses) per event
_LIST = "[]"  # a leaf's path step into a list's elements


@dataclass(frozen=True, slots=True)
class _Leaf:
    """One output field and where its values sit in an Arrow column."""

    field: Field
    column: str  # the top-level column holding it
    steps: tuple[str, ...] = ()  # struct children to descend into, ``_LIST`` for a list level


@dataclass(frozen=True, slots=True)
class _Layout:
    """What one file gives: fields from its columns, fields joined from the events table, names skipped."""

    leaves: tuple[_Leaf, ...]
    joined: tuple[_Leaf, ...]
    skipped: tuple[str, ...]
    key: str | None

    @property
    def columns(self) -> list[str]:
        """Top-level columns to read from an input file (the key first)."""
        return list(dict.fromkeys([*([self.key] if self.key else []), *(leaf.column for leaf in self.leaves)]))

    @property
    def joined_columns(self) -> list[str]:
        return list(dict.fromkeys(leaf.column for leaf in self.joined))

    def schema(self) -> EventSchema:
        key = [Field(name=self.key, dtype="<i8")] if self.key else []
        return EventSchema(tuple(key + [leaf.field for leaf in (*self.leaves, *self.joined)]))


def _numeric(t: Any) -> tuple[str, tuple[int, ...]] | None:
    """(numpy dtype, inner shape) of a number or a (nested) fixed-size list of numbers, else None."""
    import pyarrow as pa

    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.dtype(t.to_pandas_dtype()).str, tuple(shape)
    return None


def _walk(t: Any, name: str, column: str, steps: tuple[str, ...], *, counter: str | None, lists_ok: bool,
          leaves: list[_Leaf], skipped: list[str]) -> None:
    """The fields of one Arrow type: structs give dotted names, one list level a ragged group."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        for child in t:
            _walk(child.type, f"{name}.{child.name}", column, (*steps, child.name), counter=counter,
                  lists_ok=lists_ok, leaves=leaves, skipped=skipped)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        if not lists_ok:
            skipped.append(name)  # a list inside a ragged group would be ragged twice
            return
        _walk(t.value_type, name, column, (*steps, _LIST), counter=f"n_{name}", lists_ok=False,
              leaves=leaves, skipped=skipped)
    elif (kind := _numeric(t)) is not None:
        leaves.append(_Leaf(field=Field(name=name, dtype=kind[0], shape=kind[1], counter=counter),
                            column=column, steps=steps))
    else:
        skipped.append(name)


def _unique_counters(leaves: list[_Leaf], taken: set[str]) -> list[_Leaf]:
    """Counter names that are not also field names (``n_x`` → ``n_x_`` when a field ``n_x`` exists)."""
    rename: dict[str, str] = {}
    for leaf in leaves:
        c = leaf.field.counter
        if c is not None and c not in rename:
            new = c
            while new in taken or new in rename.values():
                new += "_"
            rename[c] = new
    out = []
    for leaf in leaves:
        c = leaf.field.counter
        if c is not None and rename[c] != c:
            f = leaf.field
            leaf = _Leaf(field=Field(name=f.name, dtype=f.dtype, shape=f.shape, counter=rename[c]),
                         column=leaf.column, steps=leaf.steps)
        out.append(leaf)
    return out


def _difference(a: _Layout, b: _Layout) -> str:
    """The first way two layouts differ, in words."""
    fa = {leaf.field.name: leaf.field for leaf in (*a.leaves, *a.joined)}
    fb = {leaf.field.name: leaf.field for leaf in (*b.leaves, *b.joined)}
    for name in fb:
        if name not in fa:
            return f"no column {name!r}"
    for name in fa:
        if name not in fb:
            return f"an extra column {name!r}"
    for name, f in fa.items():
        if f != fb[name]:
            return f"column {name!r} is {_kind(f)} here, {_kind(fb[name])} there"
    if a.skipped != b.skipped:
        return f"skipped columns {', '.join(a.skipped) or '-'} here, {', '.join(b.skipped) or '-'} there"
    return "the column order differs"


def _kind(f: Field) -> str:
    return f"{f.dtype}{list(f.shape) if f.shape else ''}{' ragged' if f.ragged else ''}"
