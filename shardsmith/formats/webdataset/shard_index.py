"""A tar shard's offset index as the loader takes it: the file checked against the manifest (size,
sha256 of a version-2 index), its sample offsets validated, and a full index's member table
spot-checked against the tar's own headers.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Any

import numpy as np

from shardsmith.core.npy import HEADER_MAX, read_npy
from shardsmith.errors import DatasetError
from shardsmith.formats.webdataset.tarfmt import BLOCK, ShardMembers, index_offsets, is_index_v2, parse_sample

_SPOT_CHECKS = 8  # samples per shard whose headers are read to check a full index against the tar


def _spot_check(buf: Any, found: ShardMembers, offsets: np.ndarray, *, where: str) -> None:
    """The first, the last and a few samples between, as the tar's headers describe them, must be
    as the index says: an index of another shard, or a shard changed since, is refused."""
    n = len(found.keys)
    end = int(offsets[-1])
    for j in sorted({0, n - 1, *np.linspace(0, n - 1, _SPOT_CHECKS).astype(int).tolist()}):
        key, members = parse_sample(buf, int(offsets[j]), int(offsets[j + 1]), end, where=where)
        a, b = int(found.first[j]), int(found.first[j + 1])
        want = [(found.exts[e], d, k) for e, d, k in zip(found.ext[a:b].tolist(), found.data[a:b].tolist(),
                                                          found.size[a:b].tolist())]
        if key != found.keys[j] or members != want:
            raise DatasetError(f"{where}: the offset index does not describe sample {j} at byte {int(offsets[j])} "
                               f"as the tar's headers do (an index of another shard, or a shard changed since)")


def _load_index(files: Any, entry: dict[str, Any], tar: Any) -> tuple[array, np.ndarray | None]:
    """A shard's validated sample offsets (n + 1 of them) as a compact array of Python ints, and its
    whole index when that is version 2 (its member table is checked when the shard is first used).
    ``files`` (``kit/dataset_files.py``) has checked the shard's size and reads the index file."""
    size, n = entry["bytes"], entry["samples"]
    if size < 2 * BLOCK or size % BLOCK:
        raise DatasetError(f"{tar}: {size} bytes is not a whole tar archive of 512-byte blocks")
    if not isinstance(entry.get("index"), dict):
        raise DatasetError(f"{tar}: the manifest names no offset index for this shard")
    path = files.name_of(entry["index"]["path"])
    # a member needs a header block, a key or an extension at most 100 bytes: bounded by the tar's size
    if not isinstance(n, int) or entry["index"]["bytes"] > 8 * (2 * n + 10) + 240 * (size // BLOCK) \
            + 2 * HEADER_MAX:
        raise DatasetError(f"{path}: {entry['index']['bytes']} bytes is too large an index for {n} samples of "
                           f"a {size}-byte shard")
    raw = files.sidecar(entry["index"])
    arr = read_npy(raw, where=str(path))
    full = None
    if arr.dtype.kind == "i" and arr.dtype.itemsize == 8 and arr.ndim == 1 and is_index_v2(arr):
        # the member table is trusted in place of the tar's headers only as the manifest recorded it
        if hashlib.sha256(raw).hexdigest() != entry["index"].get("sha256"):
            raise DatasetError(f"{path}: sha256 differs from the manifest's (the index changed since it was "
                               f"written)")
        full = arr.astype(np.int64, copy=False)
        offsets = index_offsets(full, where=str(path))
    else:
        offsets = arr
    if offsets.dtype.kind != "i" or offsets.dtype.itemsize != 8 or offsets.shape != (n + 1,):
        raise DatasetError(f"{path}: offsets must be int64 of shape ({n + 1},), found {offsets.dtype} "
                           f"{offsets.shape}")
    offsets = offsets.astype(np.int64)
    steps = np.diff(offsets)
    if offsets[0] != 0 or (steps < BLOCK).any() or (offsets % BLOCK).any() or offsets[-1] + 2 * BLOCK > size:
        raise DatasetError(f"{path}: offsets must start at 0, grow by whole 512-byte blocks and end at least "
                           f"two blocks before the end of the {size}-byte shard")
    return array("q", offsets.tobytes()), full
