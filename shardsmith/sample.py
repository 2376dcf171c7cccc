"""A sample: a key plus named fields, and the identity that fixes its place in the shuffle."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class Identity:
    """Where a sample came from: its input path relative to the input root, and its record number."""

    path: str
    record: int

    def key(self, copy: int | None = None) -> str:
        """A sample name with no dots or slashes (webdataset splits keys at the first dot)."""
        stem = _KEY_UNSAFE.sub("_", self.path).strip("_") or "input"
        name = f"{stem}_{self.record:09d}"
        return name if copy is None else f"{name}_{copy:03d}"


@dataclass(slots=True)
class Sample:
    """Named fields of one sample: bytes (an encoded JPEG), numbers, numpy arrays, text, token ids."""

    identity: Identity
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.identity.key()
