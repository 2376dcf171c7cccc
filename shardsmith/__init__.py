"""shardsmith: prepare training data offline, read it back fast.

Public API: ``open`` (any dataset by its manifest), ``TokenDataset`` (packed token windows),
``TarDataset`` (webdataset shards), ``EventDataset`` (HDF5 event shards),
and the errors a user can catch.
"""

from __future__ import annotations

__version__ = "0.1.0"

from shardsmith.errors import DataError, DatasetError, ShardsmithError, UsageError  # noqa: E402
from shardsmith.loader import EventDataset, TarDataset, TokenDataset, TokenDocuments, open  # noqa: E402

__all__ = [
    "DataError",
    "DatasetError",
    "EventDataset",
    "ShardsmithError",
    "TarDataset",
    "TokenDataset",
    "TokenDocuments",
    "UsageError",
    "__version__",
    "open",
]
