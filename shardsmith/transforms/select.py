"""The ``select`` transform: keep only the named fields of each row (``--transform select=id,text``),
so samples carry what training reads and no more. A row without one of them is a bad record."""

from __future__ import annotations

from typing import Any

from shardsmith.errors import UsageError
from shardsmith.kit.reader import RecordError
from shardsmith.kit.transform import Transform


class SelectFields(Transform):
    name = "select"
    applies_to = ("rows",)

    def __init__(self, *, fields: tuple[str, ...]) -> None:
        self.fields = fields

    @classmethod
    def from_spec(cls, spec: str | None, *, opts: Any) -> SelectFields:
        fields = tuple(f.strip() for f in (spec or "").split(",") if f.strip())
        if not fields:
            raise UsageError("--transform select=FIELD[,FIELD...] needs at least one field name")
        if len(set(fields)) != len(fields):
            raise UsageError(f"--transform select={spec}: a field is named twice")
        return cls(fields=fields)

    def apply(self, value: Any, *, identity: str, copy: int) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise RecordError(f"expected a row of named fields, got {type(value).__name__}")
        missing = [f for f in self.fields if f not in value]
        if missing:
            raise RecordError(f"no field {missing[0]!r} to select (fields: {', '.join(list(value)[:8])})")
        return {f: value[f] for f in self.fields}

    def describe(self) -> dict[str, Any]:
        return {"transform": self.name, "fields": list(self.fields)}
