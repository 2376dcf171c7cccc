"""A field's name as it can name a part of a sample on disk (a tar member's extension, a column
file): letters, digits, ``_`` and ``-`` kept, anything else (dots, slashes) made ``_``. One rule,
so that a source checking its columns before any work and the format naming them agree."""

from __future__ import annotations

import re

_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def safe_name(field: str) -> str:
    """``field`` unchanged if it is safe, else with every other character replaced by ``_``."""
    return field if _SAFE.match(field) else _UNSAFE.sub("_", field)
