"""Why a row gives no text (``--text-field``), worded once for every command that reads text.

A first record without the field usually means the wrong field name, not a bad record: the message
names the fields the record has and the option that chooses one, before ``--on-error skip``. A
Parquet file without the column (its text read alone) says so in the same words (``no_text_column``).
"""

from __future__ import annotations

from typing import Any

SHOWN_FIELDS = 8


def why_no_text(value: Any, field: str) -> str:
    """Why ``value`` (a parsed row) has no string ``field``, in a few words and a way out."""
    if not isinstance(value, dict):
        return f"expected a JSON object with a {field!r} field, got {type(value).__name__}"
    if field not in value:
        return (f"no {field!r} field; its fields: {_listed(list(value))} (name the text with --text-field, "
                "or pass --on-error skip to skip such records)")
    if value[field] is None:
        return f"{field!r} is null"
    return f"{field!r} is a {type(value[field]).__name__}, not a string"


def no_text_column(field: str, names: list[str]) -> str:
    """Why a Parquet file gives no text: it has no column ``field`` (every row would lack it)."""
    return f"no {field!r} column; its columns: {_listed(names)} (name the text with --text-field)"


def _listed(names: list[Any]) -> str:
    shown = ", ".join(map(str, names[:SHOWN_FIELDS])) + (", ..." if len(names) > SHOWN_FIELDS else "")
    return shown or "(none)"
