"""Which files in an output folder (or keys under a prefix) are shardsmith's: what ``--overwrite``
may remove and what an upload publishes. A file of another tool is never touched."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from shardsmith.core.manifest import MANIFEST, RUN_FILE

CARD = "README.md"

# The folder of a dataset's index files, which readers of the shards alone must not take for data:
# HuggingFace ``datasets`` skips folders whose names start with ``__`` when it looks for a split's
# files (``data_files._is_inside_unrequested_special_dir``), and takes every other file named after
# a split, an index too. Its files are ``{INDEX_DIR}/...`` wherever the manifest names them.
INDEX_DIR = "__index__"
# What a shardsmith conversion may leave in its folder; --overwrite removes only these.
OWN_PATTERNS = (MANIFEST, "tokenizer.json", "*-[0-9][0-9][0-9][0-9][0-9][0-9].*", "*.bin", "*.idx",
                "*.wids.json", "*.memmap.json", ".*.tmp-*", RUN_FILE, CARD,
                # the files other tools read beside the shards (formats/tokens/neighbours.py)
                "tokenizer_config.json", "special_tokens_map.json", "meta.pkl")
OWN_FOLDERS = {INDEX_DIR: ("*-[0-9][0-9][0-9][0-9][0-9][0-9].offsets.npy", "*.wids.json", ".*.tmp-*")}


def own_file(rel: str) -> bool:
    """Whether a file shardsmith writes into an output has this path (relative to the output: a
    top-level name, or one in an own folder). Object keys are checked with it too."""
    head, _, name = rel.rpartition("/")
    patterns = OWN_PATTERNS if not head else OWN_FOLDERS.get(head, ())
    return any(fnmatch.fnmatch(name, pat) for pat in patterns)


def _own_folder(p: Path) -> bool:
    """An entry of an output that is one of its own folders (a real folder: a link to one is foreign)."""
    return p.name in OWN_FOLDERS and p.is_dir() and not p.is_symlink()


def own_files(out: Path) -> list[str]:
    """shardsmith's files in an output folder (own folders' too), as relative paths, sorted."""
    found = []
    for p in out.iterdir():
        if _own_folder(p):
            found += [f"{p.name}/{q.name}" for q in p.iterdir() if q.is_file() and own_file(f"{p.name}/{q.name}")]
        elif p.is_file() and own_file(p.name):
            found.append(p.name)
    return sorted(found)
