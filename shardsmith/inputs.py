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
    mtime_ns: int = 0  # when it was last changed: a resumed run reuses work only on unchanged inputs


def _walk(folder: str) -> list[tuple[str, str, int, int]]:
    """(absolute path, path relative to ``folder`` in POSIX form, size, mtime) of every non-hidden file below it.

    One ``scandir`` pass with the sizes it already has: a folder of a million images is listed in
    seconds, not minutes.
    """
    found: list[tuple[str, str, int, int]] = []
    stack = [(folder, "")]
    seen = {(os.stat(folder).st_dev, os.stat(folder).st_ino)}  # symlinked folders are followed once
    while stack:
        path, rel = stack.pop()
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                sub = f"{rel}{entry.name}"
                if entry.is_dir(follow_symlinks=True):
                    st = entry.stat(follow_symlinks=True)
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        stack.append((entry.path, sub + "/"))
                elif entry.is_file(follow_symlinks=True):
                    st = entry.stat(follow_symlinks=True)
                    found.append((entry.path, sub, st.st_size, st.st_mtime_ns))
    return found


def discover(paths: list[str], *, suffixes: tuple[str, ...]) -> list[InputFile]:
    """Files named on the command line plus those found in folders, sorted by identity.

    The root is the deepest folder that holds every input, so the identities (and so the shuffle
    and the splits) stay the same when the whole tree moves.
    """
    if not paths:
        raise UsageError("no inputs given")
    found: list[tuple[str, str, int, int, str]] = []  # absolute path, relative to its argument, size, mtime, group
    roots: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            base = os.path.abspath(p)
            matched = [(a, r, n, t) for a, r, n, t in _walk(base) if r.lower().endswith(suffixes)]
            if not matched:
                raise UsageError(f"{raw}: no input files ({', '.join(suffixes)}) in this folder")
            roots.append(base)
            found.extend((a, r, n, t, r.split("/", 1)[0] if "/" in r else "") for a, r, n, t in matched)
        elif p.is_file():
            if not p.name.lower().endswith(suffixes):
                raise UsageError(f"{raw}: not a supported input (expected {', '.join(suffixes)})")
            absolute = os.path.abspath(p)
            roots.append(os.path.dirname(absolute))
            st = p.stat()
            found.append((absolute, p.name, st.st_size, st.st_mtime_ns, ""))
        elif p.exists():
            raise UsageError(f"{raw}: not a regular file or folder")
        else:
            raise UsageError(f"{raw}: no such file or folder")
    root = os.path.commonpath(roots)
    by_rel: dict[str, tuple[str, int, str, int]] = {}
    single = len(roots) == 1 and len(paths) == 1 and roots[0] == root and Path(paths[0]).is_dir()
    for absolute, rel0, size, mtime, group in found:
        if single:
            rel = rel0  # already relative to the one root, in POSIX form
        else:
            rel = absolute[len(root):].lstrip(os.sep).replace(os.sep, "/") if absolute.startswith(root) else \
                Path(os.path.relpath(absolute, root)).as_posix()
        by_rel.setdefault(rel, (absolute, size, group, mtime))
    return [InputFile(absolute, rel, i, size, group, mtime)
            for i, (rel, (absolute, size, group, mtime)) in enumerate(sorted(by_rel.items()))]
