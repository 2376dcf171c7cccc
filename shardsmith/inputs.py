"""Finding input files and giving each a stable identity: its path relative to the input root."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shardsmith.errors import UsageError


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file: where it is, and the relative path that names its records."""

    path: str
    rel: str
    index: int
    size: int
    group: str = ""  # first folder below the input argument it was found in (an image folder's class)


def _walk(folder: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(dirpath, f) for f in sorted(filenames) if not f.startswith("."))
    return found


def discover(paths: list[str], *, suffixes: tuple[str, ...]) -> list[InputFile]:
    """Files named on the command line plus those found in folders, sorted by identity.

    The root is the deepest folder that holds every input, so the identities (and so the shuffle
    and the splits) stay the same when the whole tree moves.
    """
    if not paths:
        raise UsageError("no inputs given")
    files: list[Path] = []
    groups: dict[str, str] = {}
    roots: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            matched = [f for f in _walk(p) if f.name.lower().endswith(suffixes)]
            if not matched:
                raise UsageError(f"{raw}: no input files ({', '.join(suffixes)}) in this folder")
            files.extend(matched)
            roots.append(os.path.abspath(p))
            for f in matched:
                parts = Path(os.path.relpath(f, p)).parts
                groups[os.path.abspath(f)] = parts[0] if len(parts) > 1 else ""
        elif p.is_file():
            if not p.name.lower().endswith(suffixes):
                raise UsageError(f"{raw}: not a supported input (expected {', '.join(suffixes)})")
            files.append(p)
            roots.append(os.path.dirname(os.path.abspath(p)))
        elif p.exists():
            raise UsageError(f"{raw}: not a regular file or folder")
        else:
            raise UsageError(f"{raw}: no such file or folder")
    root = os.path.commonpath(roots)
    by_rel: dict[str, str] = {}
    for f in files:
        absolute = os.path.abspath(f)
        by_rel.setdefault(Path(os.path.relpath(absolute, root)).as_posix(), absolute)
    return [
        InputFile(path=by_rel[rel], rel=rel, index=i, size=os.path.getsize(by_rel[rel]),
                  group=groups.get(by_rel[rel], ""))
        for i, rel in enumerate(sorted(by_rel))
    ]
