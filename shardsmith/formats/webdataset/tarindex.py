"""The offset index of a tar shard (``__index__/{split}-{000000}.offsets.npy``): written (``index_array``),
recognised (``is_index_v2``) and read back checked (``index_offsets``, ``index_members``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.errors import DatasetError
from shardsmith.formats.webdataset.tarheader import BLOCK, MAX_SIZE
from shardsmith.formats.webdataset.tarscan import ShardMembers

# ``__index__/{split}-{000000}.offsets.npy`` is one int64 array. Version 1 held only where each of the n
# samples' first header starts, then where the end-of-archive blocks start (n + 1 offsets). Version
# 2 (written since) starts with a head of 8 numbers, then holds those offsets, each sample's first
# member (n + 1), each member's data offset, size and extension number (m each), and a blob of
# UTF-8 bytes: the keys, then the extensions (numbered by first use), NUL-separated and padded to
# whole int64s. A reader takes a shard's member table straight from it, without its tar headers.
INDEX_MAGIC = int.from_bytes(b"SSIDX\x00\x00\x02", "little")
INDEX_VERSION = 2
_INDEX_HEAD = 8  # magic, version, n, m, extensions, key bytes, extension bytes, 0


def index_array(offsets: Any, first: Any, data: Any, size: Any, ext_names: list[str], keys: list[str]) -> np.ndarray:
    """The version-2 offset index of a shard: ``offsets`` (n + 1), ``first`` (n + 1: each sample's
    first member, then m), each member's ``data`` offset, ``size`` and extension name, each sample's key."""
    exts = list(dict.fromkeys(ext_names))  # numbered by first use, as a member-by-member parse numbers them
    ids = {e: i for i, e in enumerate(exts)}
    key_blob = "\x00".join(keys).encode("utf-8")
    ext_blob = "\x00".join(exts).encode("utf-8")
    blob = key_blob + ext_blob
    blob += bytes(-len(blob) % 8)
    head = [INDEX_MAGIC, INDEX_VERSION, len(keys), len(ext_names), len(exts), len(key_blob), len(ext_blob), 0]
    return np.concatenate([np.asarray(head, np.int64), np.asarray(offsets, np.int64), np.asarray(first, np.int64),
                           np.asarray(data, np.int64), np.asarray(size, np.int64),
                           np.fromiter(map(ids.__getitem__, ext_names), np.int64, count=len(ext_names)),
                           np.frombuffer(blob, "<i8").astype(np.int64)])


def is_index_v2(arr: np.ndarray) -> bool:
    """Whether a loaded offset index is version 2 (version 1 starts with offset 0)."""
    return arr.ndim == 1 and len(arr) >= _INDEX_HEAD and int(arr[0]) == INDEX_MAGIC


def index_offsets(arr: np.ndarray, *, where: str) -> np.ndarray:
    """The n + 1 sample offsets of a version-2 index (its head checked; the rest by ``index_members``)."""
    _, version, n, m, e, nkey, next_, zero = (int(x) for x in arr[:_INDEX_HEAD])
    words = -(-(nkey + next_) // 8) if min(n, m, e, nkey, next_) >= 0 else -1
    if version != INDEX_VERSION or zero or words < 0 or len(arr) != _INDEX_HEAD + 2 * (n + 1) + 3 * m + words:
        raise DatasetError(f"{where}: offset index version {version} with {n} samples and {m} members does not "
                           f"match its {len(arr)} numbers")
    return arr[_INDEX_HEAD:_INDEX_HEAD + n + 1]


def index_members(arr: np.ndarray, *, where: str) -> ShardMembers:
    """A version-2 index's member table, checked: members fill their samples exactly, back to back,
    as tar lays them out; extension numbers in range and none repeated in a sample; keys and
    extensions well formed. ``index_offsets`` has checked the head, the caller the sample offsets."""
    _, _, n, m, e, nkey, next_, _ = (int(x) for x in arr[:_INDEX_HEAD])
    at = _INDEX_HEAD
    offsets = arr[at:at + n + 1]
    first = arr[at + n + 1:at + 2 * n + 2]
    data, size, ext = (arr[at + 2 * n + 2 + i * m:at + 2 * n + 2 + (i + 1) * m] for i in range(3))
    blob = arr[at + 2 * n + 2 + 3 * m:].tobytes()

    def bad(reason: str) -> DatasetError:
        return DatasetError(f"{where}: offset index: {reason}")

    counts = np.diff(first)
    if n < 1 or first[0] != 0 or first[-1] != m or (counts < 1).any():
        raise bad("each sample must own one or more members, in order")
    if (size < 0).any() or (size > MAX_SIZE).any() or (ext < 0).any() or (ext >= e).any():
        raise bad("a member size or extension number is out of range")
    # where each member's header must be: the sample's start, else right after the previous member
    end = data + size + (-size % BLOCK)
    header = np.empty(m, np.int64)
    header[1:] = end[:-1]
    header[first[:-1]] = offsets[:-1]
    if not (np.array_equal(data - BLOCK, header) and np.array_equal(end[first[1:] - 1], offsets[1:])):
        raise bad("members do not fill their samples back to back")
    if e > 1 and (counts > 1).any():
        codes = np.repeat(np.arange(n, dtype=np.int64), counts) * e + ext
        codes.sort()
        if (codes[1:] == codes[:-1]).any():
            raise bad("a sample repeats an extension")
    try:
        keys = blob[:nkey].decode("utf-8").split("\x00")
        exts = blob[nkey:nkey + next_].decode("utf-8").split("\x00")
    except UnicodeDecodeError:
        raise bad("a key or extension is not UTF-8") from None
    joined = "\x00".join(keys)
    if len(keys) != n or "" in keys or "." in joined or "/" in joined:
        raise bad(f"expected {n} keys, each non-empty without dots or slashes")
    if len(exts) != e or len(set(exts)) != e or any(not x or "/" in x or x[0] == "." or ".." in x for x in exts):
        raise bad(f"expected {e} distinct extensions, each non-empty without '/', a leading dot or '..'")
    return ShardMembers(keys, first, data, size, ext, exts)


def index_extensions(arr: np.ndarray, *, where: str) -> list[str]:
    """The member extensions a version-2 index names (its head and names only: the dataset card's
    look at a shard, which reads nothing else of it)."""
    _, _, n, m, e, nkey, next_, _ = (int(x) for x in arr[:_INDEX_HEAD])
    index_offsets(arr, where=where)  # the head against the array's length
    blob = np.asarray(arr[_INDEX_HEAD + 2 * (n + 1) + 3 * m:]).tobytes()
    try:
        exts = blob[nkey:nkey + next_].decode("utf-8").split("\x00")
    except UnicodeDecodeError:
        raise DatasetError(f"{where}: offset index: an extension is not UTF-8") from None
    if len(exts) != e:
        raise DatasetError(f"{where}: offset index: expected {e} extensions, found {len(exts)}")
    return exts
