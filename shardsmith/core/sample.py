"""A sample's identity, which fixes its place in the shuffle, and its key (a sample itself, the
neutral one every format receives, is ``kit/sample.py``'s)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class Identity:
    """Where a sample came from: its input path relative to the input root, and its record number."""

    path: str
    record: int

    def key(self, copy: int | None = None) -> str:
        """A short sample name with no dots or slashes (webdataset splits keys at the first dot).

        The readable part is the tail of the path; the hash of the full identity keeps names
        unique where cleaning the path made two of them alike.
        """
        stem = _KEY_UNSAFE.sub("_", self.path).strip("_")[-48:] or "input"
        ident = f"{self.path}\0{self.record}\0{copy}".encode()
        digest = hashlib.blake2b(ident, digest_size=4).hexdigest()
        name = f"{stem}-r{self.record}" + ("" if copy is None else f"-c{copy}")
        return f"{name}-{digest}"
