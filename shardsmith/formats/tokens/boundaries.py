"""A packed shard's document boundaries (``{shard}.cu.npy``, ``pack-tokens --pack``): where each document
piece ends in the shard's tokens. One reader for the loader (``PackedSequences``), ``verify`` (the
origins' row count) and ``inspect --report``, each file checked as ``core/npy.py`` checks a sidecar.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.core.npy import read_npy
from shardsmith.errors import DatasetError


def read_boundaries(files: Any, entry: dict[str, Any], *, tokens: int | None) -> np.ndarray:
    """A packed shard's document-piece ends (its ``.cu.npy``, named by the manifest ``entry``), int64,
    checked: integers, increasing, each inside the shard's ``tokens`` (when known). ``files``: the
    dataset's files (``kit.dataset_files``), which read only inside it and check the size."""
    path = files.name_of(entry["path"])
    try:
        data = files.sidecar(entry)
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read the document boundaries ({exc.strerror or exc})") from None
    ends = read_npy(data, where=f"{path}: document boundaries", kinds="iu", ndim=1)
    if ends.dtype.itemsize > 8 or (ends.dtype.kind == "u" and len(ends) and int(ends.max()) >= 1 << 63):
        raise DatasetError(f"{path}: document boundaries beyond int64")
    ends = ends.astype(np.int64)
    if len(ends) and (np.any(np.diff(ends) <= 0) or ends[0] <= 0 or (tokens is not None and ends[-1] > tokens)):
        raise DatasetError(f"{path}: document boundaries are not increasing inside the shard")
    return ends
