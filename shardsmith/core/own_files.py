"""Which files in an output folder (or keys under a prefix) are shardsmith's: what ``--overwrite``
may remove, what a rerun may take over and what an upload publishes. A file of another tool is
never touched.

No format is named here. Each format declares what it writes into an output (``Format.own_files``,
an ``OwnFiles``): file names at the top of the folder, and folders of its own with the files they
hold (an index folder, a shard written as a folder, a dataset that is a folder tree). The registry
joins every installed format's declaration with ``EVERY_OUTPUT``, what every run leaves (the
manifest, its run record, the dataset card, temporary files), and the engine and the upload ask the
result.

Patterns are ``fnmatch`` patterns matched one path segment at a time (``*`` never crosses a ``/``);
a segment ``**`` matches any number of segments, so ``("**",)`` is everything below a folder.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shardsmith.core.manifest import MANIFEST, RUN_FILE

CARD = "README.md"
# what ``core.fsutil`` names a file while it is written (``.{name}.tmp-{host}-{pid}``), and a
# format a folder it builds before renaming it into place
TEMP_MARK = ".tmp-"
TEMP = f".*{TEMP_MARK}*"


def _segments_match(parts: list[str], pattern: list[str]) -> bool:
    """Whether path segments ``parts`` match the pattern's segments (``**``: any number of them)."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_segments_match(parts[i:], rest) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _segments_match(parts[1:], rest)


def matches(rel: str, pattern: str) -> bool:
    """Whether the relative path ``rel`` matches ``pattern``, segment by segment."""
    return _segments_match(rel.split("/"), pattern.split("/"))


def temp_base(name: str) -> str | None:
    """The name a temporary entry will have once it is renamed into place (``.x.tmp-host-1`` is
    ``x``), or None for a name that is not a temporary one."""
    if not name.startswith(".") or TEMP_MARK not in name:
        return None
    return name[1:name.rindex(TEMP_MARK)] or None


@dataclass(frozen=True)
class Folder:
    """A folder that a format writes at the top of an output, and which of the files below it are
    its own: an index folder holds its index files only (a user's note in it stays); a shard or a
    dataset written as a folder owns all of it (``("**",)``)."""

    name: str  # a pattern of the folder's name
    holds: tuple[str, ...] = ("**",)  # patterns of its files' paths, relative to the folder


@dataclass(frozen=True)
class OwnFiles:
    """What one format (or, joined with ``|``, every installed format and the run itself) may leave
    in an output folder: ``files``, patterns of names at its top; ``folders``, its own folders.
    A temporary file (``TEMP``) anywhere in it is a run's own, and a temporary folder at the top is
    own when the folder it becomes is."""

    files: tuple[str, ...] = ()
    folders: tuple[Folder, ...] = ()

    def __or__(self, other: OwnFiles) -> OwnFiles:
        return OwnFiles(files=tuple(dict.fromkeys((*self.files, *other.files))),
                        folders=tuple(dict.fromkeys((*self.folders, *other.folders))))

    # -- by name: object keys, and entries whose kind is not looked at ----------------------------
    def holds(self, name: str) -> tuple[str, ...] | None:
        """What the folder named ``name`` (at the top of an output) may hold of its own, or None when
        it is not an own folder (a temporary folder: all of it, if the folder it becomes is own)."""
        found = [p for f in self.folders if fnmatch.fnmatchcase(name, f.name) for p in f.holds]
        if found:
            return tuple(found)
        base = temp_base(name)
        return ("**",) if base is not None and self.holds(base) is not None else None

    def top_file(self, name: str) -> bool:
        """Whether a file named ``name`` at the top of an output is own."""
        return any(fnmatch.fnmatchcase(name, p) for p in (*self.files, TEMP))

    def owns(self, rel: str) -> bool:
        """Whether the file at ``rel`` (relative to the output, ``/``-separated: an object key too) is own."""
        head, sep, rest = rel.partition("/")
        if not sep:
            return self.top_file(rel)
        holds = self.holds(head)
        if holds is None:
            return False
        return any(matches(rest, p) for p in holds) or fnmatch.fnmatchcase(rest.rpartition("/")[2], TEMP)

    # -- in a folder --------------------------------------------------------------------------------
    def folder(self, p: Path) -> bool:
        """Whether the entry ``p`` at the top of an output is an own folder (a real one: a link is foreign)."""
        return self.holds(p.name) is not None and p.is_dir() and not p.is_symlink()

    def ours(self, p: Path, *, card: bool = True) -> bool:
        """Whether the entry ``p`` at the top of an output is wholly own: an own file, or an own
        folder holding only own files (and folders of them). ``card``: a ``README.md`` counts as the
        dataset card (a folder's own ``README.md``, without a dataset or a run record, is the user's)."""
        if self.folder(p):
            return all(own for _, own in self.walk(p))
        return p.is_file() and (card or p.name != CARD) and self.top_file(p.name)

    def walk(self, folder: Path) -> Iterator[tuple[str, bool]]:
        """Everything below an own folder that is not a folder, as (path relative to the output,
        whether it is own): a link, a socket or a file the format does not claim is not."""
        for here, dirs, names in os.walk(folder):
            rel_dir = Path(here).relative_to(folder.parent).as_posix()
            for d in list(dirs):
                if os.path.islink(os.path.join(here, d)):  # a link to a folder: never entered, never own
                    dirs.remove(d)
                    yield f"{rel_dir}/{d}", False
            for name in names:
                path = os.path.join(here, name)
                rel = f"{rel_dir}/{name}"
                yield rel, os.path.isfile(path) and not os.path.islink(path) and self.owns(rel)

    def listed(self, out: Path) -> list[str]:
        """The own files of an output folder (those in its own folders too), as relative paths, sorted."""
        found = []
        for p in out.iterdir():
            if self.folder(p):
                found += [rel for rel, own in self.walk(p) if own]
            elif p.is_file() and self.top_file(p.name):
                found.append(p.name)
        return sorted(found)

    def remove(self, out: Path, *, card: bool = True, keep: frozenset[str] = frozenset()) -> None:
        """Remove the own files of ``out`` (but those named in ``keep``, relative paths), and its own
        folders (and the folders in them) once they are empty."""
        for p in sorted(out.iterdir()):
            if self.folder(p):
                for rel, own in list(self.walk(p)):
                    if own and rel not in keep:
                        (out / rel).unlink(missing_ok=True)
                for here, _, _ in sorted(os.walk(p), key=lambda w: -len(w[0])):  # deepest first
                    with contextlib.suppress(OSError):
                        os.rmdir(here)
            elif self.ours(p, card=card) and p.name not in keep:
                p.unlink(missing_ok=True)

    def foreign(self, out: Path, *, card: bool = True) -> list[str]:
        """What ``out`` holds that is not its own, by path (``present``'s names): what ``--overwrite``
        must leave, and so refuses before it removes anything."""
        found = []
        for p in sorted(out.iterdir()):
            if self.folder(p):
                found += sorted(rel for rel, own in self.walk(p) if not own)
            elif not self.ours(p, card=card):
                found.append(p.name)
        return found

    def present(self, out: Path) -> list[str]:
        """What ``out`` holds, by path: each entry at its top, but an own folder by the files in it
        (what is left in an index folder is the user's note there, not the folder)."""
        found = []
        for p in sorted(out.iterdir()):
            found += sorted(rel for rel, _ in self.walk(p)) if self.folder(p) else [p.name]
        return found


# what every run leaves in its output, whatever its format
EVERY_OUTPUT = OwnFiles(files=(MANIFEST, RUN_FILE, CARD))
