"""The exact HuggingFace ``datasets`` type of a tar dataset's JSON rows, for the dataset card.

``datasets`` decodes a ``.json`` member with ``json.loads`` and then stores it as its feature says.
Its ``json`` feature writes the value again with pandas' ujson, 10 decimals (0.7288508165275867
becomes 0.7288508165, 1.5e-12 becomes 0.0, 1e308 overflows to inf), so a card must not name it. A
typed feature stores every value exactly, when the rows have one: every JSON number at one place an
integer within int64 (``datasets`` 5.2 writes a Python int through int64 even for a uint64 column)
or every one a float (float64 holds every JSON float ``json.loads`` gives), the same keys in every
object at one place, lists of one element type; a null fits any type (Arrow values are nullable,
and come back as None). ``row_type`` walks the rows once, folding their
shapes; the type found, or None when there is none (an int here and a float there would come back
as 1.0; a key missing in one row would come back as None), is what the card declares.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import orjson

# a shape: a tuple whose first item is its kind. ("never",): nothing seen yet (an empty list's
# items); ("null",); ("bool",); ("int",); ("float",); ("str",); ("list", item shape);
# ("dict", ((key, shape), ...)) in the first row's key order.
NEVER, NULL, BOOL, INT, FLOAT, STR = ("never",), ("null",), ("bool",), ("int",), ("float",), ("str",)


class NoExactType(Exception):
    """The rows have no one ``datasets`` type that keeps every value exactly."""


def shape_of(value: Any) -> tuple:
    """A decoded JSON value's shape (NoExactType for an integer beyond int64, an empty object)."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        if not -(1 << 63) <= value < 1 << 63:
            raise NoExactType(f"the integer {value} is beyond int64")
        return INT
    if isinstance(value, float):
        return FLOAT
    if isinstance(value, str):
        return STR
    if isinstance(value, list):
        item = NEVER
        for v in value:
            item = join(item, shape_of(v))
        return ("list", item)
    if isinstance(value, dict):
        if not value:
            raise NoExactType("an empty object has no struct type")
        return ("dict", tuple((k, shape_of(v)) for k, v in value.items()))
    raise NoExactType(f"a {type(value).__name__} is no JSON value")


@functools.lru_cache(maxsize=4096)
def join(a: tuple, b: tuple) -> tuple:
    """The shape of values of shapes a and b together (NoExactType when they have none)."""
    if a == b or b in (NEVER, NULL):
        return a
    if a in (NEVER, NULL):
        return b
    if a[0] != b[0]:
        raise NoExactType(f"a {_said(a)} and a {_said(b)} in one place")
    if a[0] == "list":
        return ("list", join(a[1], b[1]))
    assert a[0] == "dict"
    fields, others = dict(a[1]), dict(b[1])
    if fields.keys() != others.keys():
        missing = sorted(fields.keys() ^ others.keys())[:3]
        raise NoExactType(f"objects with and without the keys {missing} in one place")
    return ("dict", tuple((k, join(s, others[k])) for k, s in a[1]))


def _said(shape: tuple) -> str:
    return {"dict": "object", "str": "string"}.get(shape[0], shape[0])


def row_type(rows: Iterable[bytes]) -> tuple:
    """The joined shape of JSON rows (each one member's bytes); NoExactType when there is none."""
    found = NEVER
    for raw in rows:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise NoExactType(f"a member is not JSON ({exc})") from None
        found = join(found, shape_of(value))
    return found


def yaml_feature(name: str, shape: tuple) -> dict[str, Any]:
    """A feature of ``dataset_info.features`` (the YAML list form ``datasets`` reads) for a shape."""
    inner = _inner(shape)
    if isinstance(inner, list):
        return {"name": name, "struct": inner}
    if isinstance(inner, dict):
        return {"name": name, **inner}
    return {"name": name, "dtype": inner}


def _inner(shape: tuple) -> Any:
    """A shape as ``datasets`` writes a type in YAML: a dtype name, a field list, or ``{"list": inner}``."""
    kind = shape[0]
    if kind == "dict":
        return [yaml_feature(k, s) for k, s in shape[1]]
    if kind == "list":
        return {"list": _inner(shape[1])}
    return {"never": "null", "null": "null", "bool": "bool", "int": "int64", "float": "float64", "str": "string"}[kind]
