"""Globs among the inputs: one rule for local paths (``engine/inputs/files.py``) and URLs (``storage/listing.py``).

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
    """The files a local glob matches, sorted (empty when none). ``**`` enters no linked folder, as
    bash's ``globstar`` does not: Python's ``glob`` follows them, so one link to a folder above names
    every file 40 times over (until the path is too long) and two of them never end."""
    return sorted({p for p in _expanded(pattern) if os.path.isfile(p)})


def _expanded(pattern: str) -> list[str]:
    """``glob.glob(pattern)``, each ``**`` folder a folder below, not a link, and not hidden."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return glob.glob(pattern)
    at = parts.index("**")
    head, rest = os.sep.join(parts[:at]), os.sep.join(parts[at + 1:])
    bases = [""] if at == 0 else [os.sep] if not head else glob.glob(head) if is_glob(head) else [head]
    found = []
    for base in bases:  # ("": the current folder, its paths spelled relative as glob spells them)
        for folder, names, files in os.walk(base or os.curdir):
            names[:] = sorted(n for n in names if not n.startswith("."))
            here = folder if base else os.path.relpath(folder)
            top = here == os.curdir
            if rest:
                found += _expanded(rest if top else os.path.join(glob.escape(here), rest))
            else:  # a pattern that ends in **: every file and folder below
                found += [n if top else os.path.join(here, n) for n in (*names, *files) if not n.startswith(".")]
    return found
