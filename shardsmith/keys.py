"""64-bit keys: a pure function of (seed, identity), so order never depends on workers or ranks.

A sample's identity is its input path relative to the input root and its record number. The
path is hashed once per file (blake2b); records are mixed in vectorized with the splitmix64
finalizer, which is a bijection on 64-bit integers, so distinct records of a file never collide
within a file and keys look uniform.
"""

from __future__ import annotations

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
ORDER_RECORD_BITS = 40


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on a uint64 array (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


def path_hash(salt: str, path: str) -> np.uint64:
    """A 64-bit hash of (salt, relative path)."""
    digest = hashlib.blake2b(path.encode("utf-8"), digest_size=8, key=salt.encode("utf-8")[:64]).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def record_keys(salt: str, path: str, records: np.ndarray) -> np.ndarray:
    """Keys of the given record numbers of one file under a salt (e.g. ``'seed:0'``)."""
    base = path_hash(salt, path)
    with np.errstate(over="ignore"):
        return mix64(base ^ mix64(np.asarray(records, dtype=np.uint64) * _GOLDEN + _GOLDEN))


def shuffle_keys(seed: int, path: str, records: np.ndarray) -> np.ndarray:
    """The exact-shuffle key of each record: output order is the samples sorted by it."""
    return record_keys(f"shuffle:{seed}", path, records)


def split_draws(path: str, records: np.ndarray) -> np.ndarray:
    """A uniform draw in [0, 1) per record that ignores the seed, so splits never move when it does."""
    return (record_keys("split", path, records) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def input_order(file_index: int, records: np.ndarray) -> np.ndarray:
    """Input order as a uint64: file index in the high bits, record number in the low 40."""
    return (np.uint64(file_index) << np.uint64(ORDER_RECORD_BITS)) | np.asarray(records, dtype=np.uint64)


def keys_for(salt: str, rels: list[str], records: np.ndarray) -> np.ndarray:
    """``record_keys`` for records that may come from different files (one path per record, or one for all)."""
    if len(rels) == 1:
        return record_keys(salt, rels[0], records)
    base = np.fromiter((path_hash(salt, r) for r in rels), dtype=np.uint64, count=len(rels))
    with np.errstate(over="ignore"):
        return mix64(base ^ mix64(np.asarray(records, dtype=np.uint64) * _GOLDEN + _GOLDEN))


def orders_for(file_index: np.ndarray, records: np.ndarray) -> np.ndarray:
    """``input_order`` for records of several files."""
    return (np.asarray(file_index, dtype=np.uint64) << np.uint64(ORDER_RECORD_BITS)) | np.asarray(
        records, dtype=np.uint64)
