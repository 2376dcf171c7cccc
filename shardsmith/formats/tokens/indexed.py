"""Reading Megatron ``.idx`` files, validated: a malformed index raises DatasetError, never a crash."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.identity import Stamp, open_checked
from shardsmith.errors import DatasetError
from shardsmith.formats.tokens.writer import DTYPE_CODES, IDX_MAGIC

_HEAD = struct.Struct("<9sQBQQ")


@dataclass(frozen=True, slots=True)
class IndexedShard:
    """One ``.idx``: token dtype and each document's length and byte pointer."""

    dtype: np.dtype
    lengths: np.ndarray
    pointers: np.ndarray


def read_idx(path: Path, *, bin_bytes: int | None = None, stamp: Stamp | None = None) -> IndexedShard:
    """Parse and check an .idx: header, sizes, pointers consistent with the lengths and the .bin
    (``stamp``: the file the dataset was opened on, see ``identity``)."""
    fd = open_checked(path, stamp)
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read the index ({exc.strerror or exc})") from None
    return parse_idx(data, path, bin_bytes=bin_bytes)


def parse_idx(data: bytes, path: Any, *, bin_bytes: int | None = None) -> IndexedShard:
    """An .idx file's bytes, checked as ``read_idx`` checks them (``path``: its name, to show)."""
    if len(data) < _HEAD.size:
        raise DatasetError(f"{path}: too short for a Megatron index")
    magic, version, code, seqs, docs = _HEAD.unpack_from(data)
    if magic != IDX_MAGIC:
        raise DatasetError(f"{path}: not a Megatron index (bad magic)")
    if version != 1 or code not in DTYPE_CODES:
        raise DatasetError(f"{path}: unsupported index version {version} or dtype code {code}")
    expected = _HEAD.size + 4 * seqs + 8 * seqs + 8 * docs
    if docs < 1 or expected != len(data):
        raise DatasetError(f"{path}: index size {len(data)} does not match {seqs} sequences / {docs} documents")
    dtype = np.dtype(DTYPE_CODES[code])
    lengths = np.frombuffer(data, dtype=np.int32, count=seqs, offset=_HEAD.size).astype(np.int64)
    pointers = np.frombuffer(data, dtype=np.int64, count=seqs, offset=_HEAD.size + 4 * seqs)
    documents = np.frombuffer(data, dtype=np.int64, count=docs, offset=_HEAD.size + 12 * seqs)
    if np.any(lengths < 0):
        raise DatasetError(f"{path}: negative sequence length")
    want = np.zeros(seqs, dtype=np.int64)
    if seqs > 1:
        np.cumsum(lengths[:-1] * dtype.itemsize, out=want[1:])
    if not np.array_equal(pointers, want):
        raise DatasetError(f"{path}: byte pointers are not contiguous")
    if documents[0] != 0 or documents[-1] != seqs or np.any(np.diff(documents) < 0):
        raise DatasetError(f"{path}: document indices are not monotonic from 0 to {seqs}")
    if bin_bytes is not None and int(lengths.sum()) * dtype.itemsize != bin_bytes:
        raise DatasetError(f"{path}: lengths cover {int(lengths.sum()) * dtype.itemsize} bytes, .bin has {bin_bytes}")
    return IndexedShard(dtype=dtype, lengths=lengths, pointers=pointers.copy())
