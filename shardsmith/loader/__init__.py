"""Loaders: read a finished dataset by its manifest. numpy only; torch adapters live in shardsmith.torch."""

from __future__ import annotations

import os
from typing import Any

from shardsmith import manifest as manifest_mod
from shardsmith.errors import DatasetError
from shardsmith.loader.tokens import TokenDataset, TokenDocuments

__all__ = ["TokenDataset", "TokenDocuments", "open"]


def open(out_dir: str | os.PathLike[str], *, split: str = "train") -> Any:  # noqa: A001
    """A random-access dataset of one split, of the kind its manifest names."""
    fmt = manifest_mod.load(out_dir)["format"]
    if fmt == "tokens":
        return TokenDocuments(out_dir, split=split)
    raise DatasetError(f"{out_dir}: this shardsmith cannot read {fmt!r} datasets yet")
