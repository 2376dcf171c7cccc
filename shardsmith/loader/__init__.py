"""Loaders: read a finished dataset by its manifest. numpy only; torch adapters live in shardsmith.torch."""

from __future__ import annotations

import os
from typing import Any

from shardsmith.core import manifest as manifest_mod
from shardsmith.errors import DatasetError
from shardsmith.formats.hdf5.dataset import EventDataset
from shardsmith.formats.tokens.dataset import TokenDataset, TokenDocuments
from shardsmith.formats.webdataset.dataset import TarDataset

__all__ = ["EventDataset", "TarDataset", "TokenDataset", "TokenDocuments", "open"]


def open(out_dir: str | os.PathLike[str], *, split: str = "train", decode: str | None = None) -> Any:  # noqa: A001
    """A random-access dataset of one split, of the kind its manifest names (``decode``: for images)."""
    manifest = manifest_mod.load(out_dir)
    fmt = manifest["format"]
    if fmt == "tokens":
        return TokenDocuments(out_dir, split=split)
    if fmt == "webdataset" and "events" in manifest:
        from shardsmith.formats.event_tar.dataset import EventTarDataset

        return EventTarDataset(out_dir, split=split)
    if fmt == "webdataset":
        return TarDataset(out_dir, split=split, decode=decode)
    if fmt == "hdf5":
        return EventDataset(out_dir, split=split)
    raise DatasetError(f"{out_dir}: this shardsmith cannot read {fmt!r} datasets yet")
