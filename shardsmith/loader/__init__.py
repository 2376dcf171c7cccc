"""Loaders: read a finished dataset by its manifest. numpy only; torch adapters live in shardsmith.torch.

``open`` asks the registry which format reads the manifest; the dataset classes live with their
formats (``shardsmith.formats.<name>.dataset``) and are re-exported here, imported on first use.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["EventDataset", "EventTarDataset", "Mixture", "TarDataset", "TokenDataset", "TokenDocuments", "mix", "open"]

_CLASSES = {
    "EventDataset": "shardsmith.formats.hdf5.dataset",
    "EventTarDataset": "shardsmith.formats.event_tar.dataset",
    "Mixture": "shardsmith.loader.mixture",
    "TarDataset": "shardsmith.formats.webdataset.dataset",
    "TokenDataset": "shardsmith.formats.tokens.dataset",
    "TokenDocuments": "shardsmith.formats.tokens.dataset",
    "mix": "shardsmith.loader.mixture",  # weighted mixtures of datasets of one kind
}


def open(out_dir: str | os.PathLike[str], *, split: str = "train", decode: str | None = None) -> Any:  # noqa: A001
    """A random-access dataset of one split, of the kind its manifest names (``decode``: for images)."""
    from shardsmith import registry
    from shardsmith.core import manifest as manifest_mod

    manifest = manifest_mod.load(out_dir)
    return registry.format_of(manifest, where=str(out_dir)).open(out_dir, split=split, decode=decode)


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        import importlib

        return getattr(importlib.import_module(_CLASSES[name]), name)
    raise AttributeError(f"module 'shardsmith.loader' has no attribute {name!r}")
