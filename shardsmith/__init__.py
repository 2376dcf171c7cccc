"""shardsmith: prepare training data offline, read it back fast.

Public API: ``open`` (any dataset by its manifest), ``TokenDataset`` (packed token windows),
``TarDataset`` (webdataset shards), ``EventDataset`` (HDF5 event shards),
and the errors a user can catch (and ``ShardsmithWarning``, to filter).
"""

from __future__ import annotations

from shardsmith.core.version import __version__  # noqa: E402
from shardsmith.errors import DataError, DatasetError, ShardsmithError, ShardsmithWarning, UsageError  # noqa: E402

_LAZY = {"EventDataset", "TarDataset", "TokenDataset", "TokenDocuments", "open"}


def __getattr__(name: str):  # the loaders (numpy and all) are imported on first use, not by the CLI
    if name in _LAZY:
        from shardsmith import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'shardsmith' has no attribute {name!r}")

__all__ = [
    "DataError",
    "DatasetError",
    "EventDataset",
    "ShardsmithError",
    "ShardsmithWarning",
    "TarDataset",
    "TokenDataset",
    "TokenDocuments",
    "UsageError",
    "__version__",
    "open",
]
