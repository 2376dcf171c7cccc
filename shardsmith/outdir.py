"""Preparing the output folder: refuse to mix a new dataset into someone else's files."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from shardsmith.errors import UsageError
from shardsmith.manifest import MANIFEST

# What a shardsmith conversion may leave in its folder; --overwrite removes only these.
OWN_PATTERNS = (MANIFEST, "tokenizer.json", "*-[0-9][0-9][0-9][0-9][0-9][0-9].*", "*.bin", "*.idx",
                "*.wids.json", ".*.tmp-*")


def prepare_output(out: Path, *, overwrite: bool) -> None:
    """Create ``out``; an existing non-empty folder needs ``--overwrite``, which removes the old dataset's files."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    present = sorted(p for p in out.iterdir())
    if not present:
        return
    own = all(p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in OWN_PATTERNS) for p in present)
    if own and not (out / MANIFEST).exists():
        overwrite = True  # what a failed or killed run left: no dataset to protect
    if not overwrite:
        raise UsageError(f"-o {out}: folder is not empty ({len(present)} entries); pass --overwrite to replace "
                         f"a previous dataset there")
    (out / MANIFEST).unlink(missing_ok=True)  # first, so a half-cleaned folder is never a dataset
    for p in present:
        if p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in OWN_PATTERNS):
            p.unlink()
    left = [p.name for p in out.iterdir()]
    if left:
        raise UsageError(f"-o {out}: --overwrite removes only shardsmith's own files; also found {left[:3]}")
