"""What an HDF5 event shard must be before anything is read from it: a manifest schema of sane
names and shapes, datasets reached by hard links with their data in this file, compression filters
installed, and declared sizes backed by stored bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema
from shardsmith.errors import DatasetError, install_hint


def _bad(path: Path, msg: str) -> DatasetError:
    return DatasetError(f"{path}: {msg}")


def _check_schema(schema: EventSchema) -> None:
    """What ``EventSchema.from_json`` takes on trust: names and counters are strings, shapes are
    tuples of small non-negative ints (ValueError otherwise)."""
    for f in schema.fields:
        if not isinstance(f.dtype, str) or not (f.counter is None or (isinstance(f.counter, str) and f.counter)):
            raise ValueError(f"field {f.name!r}: dtype {f.dtype!r} or counter {f.counter!r} is not a name")
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 31 for d in f.shape):
            raise ValueError(f"field {f.name!r}: shape {list(f.shape)!r} is not a list of sizes")


def _equals(value: Any, expected: str | int) -> bool:
    """An HDF5 attribute equals a scalar: an array, or a value of another type, never does."""
    if isinstance(value, np.ndarray) and value.ndim:
        return False
    if isinstance(expected, str):
        return isinstance(value, str) and value == expected
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) == expected


def _dataset(f: Any, name: str, path: Path) -> Any:
    """A dataset reached by hard links only, with its data inside this file."""
    import h5py

    node = f
    parts = name.split("/")
    for depth, part in enumerate(parts):
        if not isinstance(node, h5py.Group):  # e.g. a fixed field where the schema says ragged
            raise _bad(path, f"{'/'.join(parts[:depth])!r} is not a group (written by another tool, or damaged?)")
        link = node.get(part, getlink=True)
        if link is None:
            raise _bad(path, f"no {'/'.join(parts[:depth + 1])!r} (written by another tool, or damaged?)")
        if not isinstance(link, h5py.HardLink):
            raise _bad(path, f"{'/'.join(parts[:depth + 1])!r} is a {type(link).__name__}; "
                             f"shardsmith reads only objects stored in the file itself")
        node = node[part]
    if not isinstance(node, h5py.Dataset):
        raise _bad(path, f"{name!r} is not a dataset")
    if node.is_virtual or node.id.get_create_plist().get_external_count():
        raise _bad(path, f"{name!r} keeps its data in other files; shardsmith reads only this file")
    return node


def _check_filters(ds: Any, path: Path) -> None:
    """Every compression filter of the dataset is available, loading hdf5plugin (blosc, zstd, …) if needed."""
    from h5py import h5z

    dcpl = ds.id.get_create_plist()
    for k in range(dcpl.get_nfilters()):
        code, _flags, _values, name = dcpl.get_filter(k)
        if h5z.filter_avail(code):
            continue
        try:
            import hdf5plugin  # noqa: F401  (registers blosc, zstd, lz4, … with HDF5)
        except ImportError:
            plugin = False
        else:
            plugin = True
        if not h5z.filter_avail(code):
            label = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            why = ("which neither HDF5 nor hdf5plugin provides" if plugin else
                   f"which needs the hdf5plugin package: {install_hint('blosc')}")
            raise _bad(path, f"{ds.name!r} is compressed with HDF5 filter {code} ({label}), {why}")


# How far each filter can expand what is stored: deflate at most 1032:1 (its format's limit), LZF
# about 88:1 (a 264-byte match in 3 bytes); blosc (LZ4 inside, as the writer sets it) measured 236:1
# on all-zero chunks. Any other filter gets the most generous of them.
_MAX_EXPANSION = {"gzip": 1032, "lzf": 100}
_OTHER_FILTERS = 2048


def _check_storage(ds: Any, path: Path, file_size: int) -> None:
    """The dataset's declared size is backed by bytes in the file, checked from metadata alone
    before anything is read or allocated: a 10 KB file that declares 3e8 events (chunks never
    written, or a contiguous dataset never allocated, both read back as fill values) is refused."""
    nbytes = int(ds.size) * ds.dtype.itemsize
    if nbytes == 0:
        return
    if ds.chunks is None:
        offset = ds.id.get_offset()
        if offset is None or offset + nbytes > file_size:
            raise _bad(path, f"{ds.name!r} declares {nbytes} bytes that the {file_size}-byte file does not hold")
        return
    expected = 1
    for size, chunk in zip(ds.shape, ds.chunks):
        expected *= -(-size // chunk)
    stored = ds.id.get_storage_size()
    if ds.id.get_num_chunks() != expected:
        raise _bad(path, f"{ds.name!r} has {ds.id.get_num_chunks()} of its {expected} chunks stored")
    limit = _MAX_EXPANSION.get(ds.compression, _OTHER_FILTERS) if ds.compression or \
        ds.id.get_create_plist().get_nfilters() else 1
    if stored > file_size or nbytes > limit * stored + (1 << 16):
        raise _bad(path, f"{ds.name!r} declares {nbytes} bytes, more than its {stored} stored bytes can hold")
