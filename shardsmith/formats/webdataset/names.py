"""Where tar shards and their indexes go in a dataset folder, and what a tar dataset owns there
(``Format.own_files``): shared by the tar formats (``webdataset``, ``event-tar``).

A shard is ``{split}-{000000}.tar`` at the top of the folder; its offset index and the split's wids
index live in the index folder, ``__index__``, so that a reader of the folder's files by name finds
the tars alone: HuggingFace ``datasets`` skips folders whose names start with ``__`` when it looks
for a split's files (``data_files._is_inside_unrequested_special_dir``), and takes every other file
named after a split, an index too. The manifest names where each index is.
"""

from __future__ import annotations

from typing import Any

from shardsmith.core.own_files import Folder, OwnFiles
from shardsmith.kit.writer import SHARD_NAMES

INDEX_DIR = "__index__"
OFFSETS = ".offsets.npy"
WIDS = ".wids.json"

# the shards, and (datasets made before the index folder) their offset indexes and wids indexes beside them
OWN_FILES = OwnFiles(files=(SHARD_NAMES, f"*{WIDS}"),
                     folders=(Folder(INDEX_DIR, holds=(f"{SHARD_NAMES.removesuffix('.*')}{OFFSETS}", f"*{WIDS}")),))


def offsets_name(shard: str) -> str:
    """Where a shard's offset index goes, relative to the dataset folder (as the manifest names it)."""
    return f"{INDEX_DIR}/{shard.removesuffix('.tar')}{OFFSETS}"


def wids_name(split: str) -> str:
    """Where a split's wids index goes, relative to the dataset folder (the manifest's ``wids``)."""
    return f"{INDEX_DIR}/{split}{WIDS}"


def wids_files(manifest: dict[str, Any]) -> list[str]:
    """The wids indexes a manifest names (``Format.side_files``)."""
    return [s["wids"] for s in manifest["splits"].values() if isinstance(s.get("wids"), str)]
