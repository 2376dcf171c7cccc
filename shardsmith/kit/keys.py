"""64-bit keys: a pure function of (seed, identity), so order never depends on workers or ranks.

A sample's identity is its input path relative to the input root and its record number. The
path is hashed once per file (blake2b); records are mixed in vectorized with the splitmix64
finalizer, which is a bijection on 64-bit integers, so distinct records of a file never collide
within a file and keys look uniform.
"""

from __future__ import annotations

import hashlib

import numpy as np

from shardsmith.kit.splits import assign_splits

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
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


def record_keys(salt: str, paths: str | list[str], records: np.ndarray) -> np.ndarray:
    """Keys of records under a salt; ``paths`` is one path for all records or one per record."""
    if isinstance(paths, str) or len(paths) == 1:
        base: np.uint64 | np.ndarray = path_hash(salt, paths if isinstance(paths, str) else paths[0])
    else:
        key = salt.encode("utf-8")[:64]
        blake = hashlib.blake2b
        base = np.frombuffer(b"".join([blake(p.encode("utf-8"), digest_size=8, key=key).digest() for p in paths]),
                             dtype="<u8").astype(np.uint64)
    with np.errstate(over="ignore"):
        return mix64(base ^ mix64(np.asarray(records, dtype=np.uint64) * GOLDEN + GOLDEN))


def shuffle_keys(seed: int, paths: str | list[str], records: np.ndarray) -> np.ndarray:
    """The exact-shuffle key of each record: output order is the samples sorted by it."""
    return record_keys(f"shuffle:{seed}", paths, records)


def split_draws(paths: str | list[str], records: np.ndarray) -> np.ndarray:
    """A uniform draw in [0, 1) per record that ignores the seed, so splits never move when it does."""
    return (record_keys("split", paths, records) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def input_order(file_index: int | np.ndarray, records: np.ndarray) -> np.ndarray:
    """Input order as a uint64: file index in the high bits, record number in the low 40."""
    return (np.asarray(file_index, dtype=np.uint64) << np.uint64(ORDER_RECORD_BITS)) | np.asarray(
        records, dtype=np.uint64)


def place(*, seed: int, shuffle: bool, splits: tuple[tuple[str, float], ...], paths: str | list[str],
          records: np.ndarray, file_index: int | np.ndarray, split_records: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each sample goes: ``(split, key, input order)``, the one definition of the output order.

    A split's samples are written sorted by ``(key, input order)`` (``output_order``): by the shuffle
    key, or in input order with ``shuffle`` off. ``split_records``: the records whose identity picks
    the split (every copy of an augmented record lands in its record's split); default ``records``.
    """
    records = np.asarray(records, dtype=np.int64)
    if len(splits) == 1:  # every draw falls in the one split: no need to hash every identity for it
        split = np.zeros(len(records), dtype=np.uint8)
    else:
        split = assign_splits(split_draws(paths, records if split_records is None else split_records), dict(splits))
    order = input_order(file_index, records)
    keys = shuffle_keys(seed, paths, records) if shuffle else order
    return split, keys, order


def output_order(keys: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The positions of samples sorted into output order: by key, ties in input order."""
    return np.lexsort((order, keys))
