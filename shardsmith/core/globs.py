"""Globs among the inputs: one rule for local paths (``engine/inputs.py``) and URLs (``storage/listing.py``).

An input holding ``*``, ``?`` or ``[`` that names no file or folder as it is written is a glob, quoted
so that the shell left it alone (``'data/*.jsonl'``, ``'s3://bucket/data/*.jsonl'``). It names every
file it matches, as a shell would expand it: sorted, hidden names left out unless the pattern spells
the dot, ``**`` for any depth of folders; folders it matches are not taken (name a folder itself).
A glob that matches no file is a usage error naming it (exit 2), never an empty run.
"""

from __future__ import annotations

import glob
import os

from shardsmith.errors import UsageError

GLOB_CHARS = "*?["


def is_glob(path: str) -> bool:
    """Whether ``path`` is a pattern (the caller checks first that it names nothing as written)."""
    return any(c in path for c in GLOB_CHARS)


def no_match(shown: str, *, noun: str = "file") -> UsageError:
    """The one line of a glob that matches nothing (``noun``: what it was matched against)."""
    return UsageError(f"{shown}: no {noun} matches")


def local_matches(pattern: str) -> list[str]:
    """The files a local glob matches, sorted (empty when none)."""
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
