"""Loaders: read a finished dataset by its manifest. numpy only; torch adapters live in shardsmith.torch.

``open`` asks the registry which format reads the manifest; the dataset classes live with their
formats (``shardsmith.formats.<name>.dataset``) and are re-exported here, imported on first use.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["EventDataset", "EventTarDataset", "MemmapDataset", "Mixture", "PackedSequences", "Schedule",
           "TarDataset", "TokenDataset", "TokenDocuments", "mix", "open"]

_CLASSES = {
    "EventDataset": "shardsmith.formats.hdf5.dataset",
    "EventTarDataset": "shardsmith.formats.event_tar.dataset",
    "MemmapDataset": "shardsmith.formats.memmap.dataset",
    "Mixture": "shardsmith.loader.mixture",
    "PackedSequences": "shardsmith.formats.tokens.packed",  # pack-tokens --pack: {tokens, cu_seqlens}
    "Schedule": "shardsmith.loader.schedule",  # mixture weights that change over training
    "TarDataset": "shardsmith.formats.webdataset.dataset",
    "TokenDataset": "shardsmith.formats.tokens.dataset",
    "TokenDocuments": "shardsmith.formats.tokens.dataset",
    "mix": "shardsmith.loader.mixture",  # weighted mixtures of datasets of one kind
}


def open(where: str | os.PathLike[str], *, split: str = "train", decode: str | None = None,  # noqa: A001
         cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str = "20GB", retries: int = 5,
         retry_wait: float = 0.5, on_error: str = "raise") -> Any:
    """A random-access dataset of one split, of the kind its manifest names (``decode``: for images).

    ``where``: a dataset folder, or a URL (``s3://bucket/prefix``, any fsspec scheme) read through a
    local cache in ``cache_dir`` holding at most ``cache_limit`` (``"20GB"``, or bytes); transient
    errors of the store are retried ``retries`` times (``storage/retry.py``). ``on_error="skip"``: a
    shard whose size differs from the manifest's is refused at its reads rather than here, so that
    ``ds.iter(on_error="skip")`` and the adapters skip its samples (``kit/dataset_files.py``)."""
    from shardsmith import registry
    from shardsmith.kit.dataset_files import files_for

    files = files_for(where, cache_dir=cache_dir, cache_limit=cache_limit, retries=retries, retry_wait=retry_wait,
                      on_error=on_error)
    manifest = files.load_manifest()
    return registry.format_of(manifest, where=files.where).open(files, split=split, decode=decode)


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        import importlib

        return getattr(importlib.import_module(_CLASSES[name]), name)
    raise AttributeError(f"module 'shardsmith.loader' has no attribute {name!r}")
