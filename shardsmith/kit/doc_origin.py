"""Where a document came from (``--provenance`` of text): one fixed-size row per document.

``file`` indexes the manifest's ``source.inputs`` (listed in full with provenance); ``record`` is
its line (JSONL, 0-based) or row (Parquet) in that file; ``offset`` the byte where its line starts
(plain JSONL; -1 where the source has no byte offset: compressed JSONL, Parquet); ``hash`` the
first 32 bits of blake2b of the document's text (UTF-8, as read, before any transform), so that a
reader of the input later can tell that the document is still the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

DOC_ORIGIN = np.dtype([("file", "<u4"), ("hash", "<u4"), ("record", "<u8"), ("offset", "<i8")])
_KEY = b"shardsmith-origin-1"


def text_hashes(texts: Sequence[str]) -> np.ndarray:
    """The ``hash`` of each text (uint32)."""
    blake = hashlib.blake2b
    joined = b"".join(blake(t.encode("utf-8", "surrogatepass"), digest_size=4, key=_KEY).digest() for t in texts)
    return np.frombuffer(joined, dtype="<u4").astype(np.uint32)
