"""The one normalization of document text that cleaning compares (``--dedup exact``,
``--decontaminate``, ``--dedup minhash``), and the 128-bit document hash exact dedup keys on.

Normalized text is Unicode NFKC, case-folded, with every run of whitespace one space, trimmed:
"Hello,\u00a0 WORLD\n" and "hello, world" are the same document. The hash is blake2b (128 bits,
keyed by purpose), a pure function of the bytes: the same on every machine, worker and run.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np

HASH_KEY = b"shardsmith-dedup-1"


_ASCII_SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"  # what ``str.split()`` splits ASCII text at, besides " "
# ... and any text once it is NFKC and case-folded (the other Unicode spaces NFKC makes " "):
# tests/test_dedup_exact.py checks this against every code point
_SPACES = _ASCII_SPACES + "\x85\u1680\u2028\u2029"


def normalize(text: str) -> str:
    """NFKC, case-folded, whitespace runs as one space, trimmed (``" ".join(nfkc(t).casefold().split())``).

    Whole-string C calls that never split the text into words (1.3-3x faster, the same result):
    NFKC only where the quick check says the text is not NFKC already, then each kind of space
    that can remain made " ", then runs of " " halved until none is left."""
    if text.isascii():
        text, spaces = text.lower(), _ASCII_SPACES  # lower is casefold on ASCII
    else:
        if not unicodedata.is_normalized("NFKC", text):
            text = unicodedata.normalize("NFKC", text)
        text, spaces = text.casefold(), _SPACES
    for c in spaces:
        if c in text:
            text = text.replace(c, " ")
    while "  " in text:
        text = text.replace("  ", " ")
    return text.strip(" ")


def doc_hashes(texts: Sequence[str], *, raw: bool = False) -> np.ndarray:
    """A (len(texts), 2) uint64 array: each text's 128-bit hash, of its normalized form (``raw``: of
    the text as it is)."""
    return utf8_hashes(((t if raw else normalize(t)).encode("utf-8", "surrogatepass") for t in texts), len(texts))


def utf8_hashes(parts: Iterable[bytes | memoryview], count: int) -> np.ndarray:
    """A (count, 2) uint64 array: the 128-bit hash (keyed blake2b) of each of ``count`` documents'
    UTF-8, the one definition of a document's hash (``textnorm_batch`` hashes its buffer with it)."""
    out = np.empty((count, 2), dtype=np.uint64)
    if count:
        blake = hashlib.blake2b
        digests = b"".join(blake(b, digest_size=16, key=HASH_KEY).digest() for b in parts)
        out[:] = np.frombuffer(digests, dtype="<u8").reshape(-1, 2)
    return out
