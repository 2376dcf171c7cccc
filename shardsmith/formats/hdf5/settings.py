"""How an event shard's HDF5 file is set up: the filters of each ``--compression``, the file-format
versions it is written with, and which field names make HDF5 link names (checked before a shard is
written, so a bad name is one line, not an h5py error half-way through)."""

from __future__ import annotations

from typing import Any

from shardsmith.core.events import EventSchema
from shardsmith.errors import UsageError, install_hint

COUNTERS_GROUP = "_counters"
COMPRESSIONS = ("none", "lzf", "gzip", "blosc")


def check_compression(compression: str) -> dict[str, Any]:
    """h5py ``create_dataset`` keywords for a compression name; blosc needs the hdf5plugin package."""
    if compression == "none":
        return {}
    if compression == "lzf":
        return {"compression": "lzf", "shuffle": True}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    if compression == "blosc":
        try:
            import hdf5plugin
        except ImportError:
            raise UsageError(f"--compression blosc needs the hdf5plugin package: {install_hint('blosc')}") from None
        return dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE))
    raise UsageError(f"--compression {compression!r}: choose one of {', '.join(COMPRESSIONS)}")


def libver() -> tuple[str, str]:
    """v1.8 object headers (large attributes stored densely) up to v1.14 structures, so HDF5 1.14 reads them."""
    import h5py

    return ("v108", "v114") if h5py.version.hdf5_version_tuple >= (1, 14) else ("v108", "latest")


def check_names(schema: EventSchema) -> None:
    """Field and counter names that make plain HDF5 link names."""
    for name in (*(f.name for f in schema.fields), *schema.counters):
        if not name or "/" in name or name in (".", COUNTERS_GROUP):
            raise UsageError(f"field or counter name {name!r} cannot be an HDF5 dataset name "
                             f"(no '/', not '.' or {COUNTERS_GROUP!r}); rename it")
