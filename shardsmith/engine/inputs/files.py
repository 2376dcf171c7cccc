"""Finding input files and giving each a stable identity: its path relative to the input root.

A command can start listing its input folders in a child process (``walk_soon``) before it
imports the rest of itself: ``discover`` then takes that listing instead of walking the folder
again, so listing a large image folder and loading numpy and the converter overlap.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

from shardsmith.core.globs import is_glob, local_matches, no_match
from shardsmith.core.input_file import InputFile
from shardsmith.core.user_warning import warn_user
from shardsmith.core.words import plural
from shardsmith.engine.inputs.folder_listing import Row, check_names, list_folder, walk_rows
from shardsmith.engine.processes.forked import ForkedAnswer
from shardsmith.errors import UsageError


def _row(path: str, rel: str, st: os.stat_result, group: str) -> Row:
    return (path, rel, st.st_size, st.st_mtime_ns, group, st.st_ctime_ns, st.st_ino)


def changed(file: InputFile) -> str | None:
    """Why ``file`` is not what it was when it was listed (size, content or the file itself), or None.
    An object read in place (its path a URL) is not looked at again: its listed version stands."""
    if "://" in file.path:
        return None
    try:
        st = os.stat(file.path)
    except OSError as exc:
        return f"changed while it was read: it is gone ({exc.strerror or exc})"
    if st.st_size != file.size:
        return f"changed while it was read: {file.size} bytes when listed, {st.st_size} now"
    if (st.st_mtime_ns, st.st_ctime_ns, st.st_ino) != (file.mtime_ns, file.ctime_ns, file.ino) and file.ctime_ns:
        return "changed while it was read: it was written to (or replaced) since it was listed"
    return None


def _walk(folder: str, suffixes: tuple[str, ...] | None, tick: Callable[[int], Any] | None = None) -> list[Row]:
    """``walk_rows`` held whole."""
    return list(walk_rows(folder, suffixes, tick))


def discover(paths: list[str], *, suffixes: tuple[str, ...], progress: Any = None, listing: Path | None = None
             ) -> Sequence[InputFile]:
    """Files named on the command line (a quoted glob: each file it matches, ``core/globs.py``) plus
    those found in folders, sorted by identity; a file named twice (by two arguments, or two
    spellings of one) is read once, and one warning line says so (``NamedTwice``).

    The root is the deepest folder that holds every input, so the identities (and so the shuffle
    and the splits) stay the same when the whole tree moves. ``progress`` (``core.progress.Progress``):
    a counter of the files found while a folder is listed here. ``listing``: where one folder's
    files are listed on disk (``folder_listing``: the listing of a folder of millions of images is
    never held whole); without it, or for other inputs, a list.
    """
    if not paths:
        raise UsageError("no inputs given")
    named = [(arg, path) for arg in paths for path in _expanded(arg)]  # (a glob's matches: each as if named alone)
    if listing is not None and len(named) == 1 and Path(named[0][1]).is_dir():
        return _listed_on_disk(named[0][1], suffixes, listing, progress)
    found: list[Row] = []
    roots: list[str] = []
    twice = NamedTwice() if len(named) > 1 else None
    for at, (_, raw) in enumerate(named):
        p = Path(raw)
        if p.is_dir():
            base = os.path.abspath(p)
            matched = _walked(base, suffixes, progress)
            if not matched:
                raise UsageError(f"{raw}: no input files ({', '.join(suffixes)}) in this folder")
            if twice is not None:
                real = os.path.realpath(base) + os.sep
                matched = [row for row in matched if twice.first(real + row[1], at)]
            if matched:  # (a folder named again adds no root: its files keep the identities they had)
                roots.append(base)
                found.extend(matched)
        elif p.is_file():
            if not p.name.lower().endswith(suffixes):
                raise UsageError(f"{raw}: not a supported input (expected {', '.join(suffixes)})")
            absolute = os.path.abspath(p)
            if twice is None or twice.first(os.path.realpath(absolute), at):
                roots.append(os.path.dirname(absolute))
                found.append(_row(absolute, p.name, p.stat(), ""))
        elif p.exists():
            raise UsageError(f"{raw}: not a regular file or folder")
        else:
            raise UsageError(f"{raw}: no such file or folder")
    if twice is not None:
        twice.warn([arg for arg, _ in named])
    return _identified(found, roots, one_folder=len(named) == 1 and Path(named[0][1]).is_dir())


def _listed_on_disk(raw: str, suffixes: tuple[str, ...], dest: Path, progress: Any) -> Sequence[InputFile]:
    base = os.path.abspath(raw)
    soon = _SOON.pop(base, None)
    if soon is not None:
        soon.cancel()  # its listing would come back whole: this one streams to disk instead
    found = list_folder(base, suffixes=suffixes, dest=dest, progress=progress)
    if not len(found):
        raise UsageError(f"{raw}: no input files ({', '.join(suffixes)}) in this folder")
    return found


def _expanded(raw: str) -> list[str]:
    """A command-line input as the paths it names: itself, or a glob's matches (none: a usage error)."""
    if not is_glob(raw) or os.path.lexists(raw):
        return [raw]
    matches = local_matches(raw)
    if not matches:
        raise no_match(raw)
    return matches


class NamedTwice:
    """Which input files the command line names more than once: by two arguments (a folder and a
    file in it, overlapping globs, the same argument twice) or by two spellings of one path (``data``
    and ``./data/``, a symbolic link). Each is read once; ``warn`` says so in one line, since a
    file named twice is most likely a slip of the command line, not a wish to read it twice (that
    would need copies: ``--copies``, or a weighted mixture at training time)."""

    def __init__(self) -> None:
        self._by: dict[str, int] = {}  # a file's key -> the argument that named it first
        self._again: Counter[tuple[int, int]] = Counter()  # (argument, the earlier one) -> files named by both

    def first(self, key: str, at: int) -> bool:
        """Whether the input ``at`` (its place among the inputs, a glob's matches each one) is the
        first to name the file ``key`` (its resolved path, or its URL)."""
        earlier = self._by.setdefault(key, at)
        if earlier != at:
            self._again[at, earlier] += 1
        return earlier == at

    def warn(self, shown: Sequence[str]) -> None:
        """One warning line naming the inputs that named files again (nothing when none did);
        ``shown``: each input as the command line gave it (a glob's matches: the glob)."""
        said: Counter[tuple[str, str]] = Counter()
        for (at, earlier), n in sorted(self._again.items()):
            said[shown[at], shown[earlier]] += n
        if said:
            warn_user("inputs named more than once are read once: " + "; ".join(
                f"{later}: {plural(n, 'file')} {'named twice' if later == first else 'also named by ' + first}"
                for (later, first), n in said.items()))


def listed(entries: list[tuple[str, bool, list[tuple[str, str, int, str]]]]) -> list[InputFile]:
    """``discover`` of a tree that is not on disk yet (inputs listed in object storage, staged
    later): each entry is (the local path an argument stands for, whether it is a folder, its files
    as (absolute path, path relative to it, size, group)). The identities are those ``discover``
    gives the same tree on disk; the files carry no times or inode (nothing to stat yet)."""
    found: list[Row] = []
    roots: list[str] = []
    for path, folder, rows in entries:
        roots.append(path if folder else os.path.dirname(path))
        found.extend((absolute, rel, size, 0, group, 0, 0) for absolute, rel, size, group in rows)
    return _identified(found, roots, one_folder=len(entries) == 1 and entries[0][1])


def _identified(found: list[Row], roots: list[str], *, one_folder: bool) -> list[InputFile]:
    """The files found below ``roots``, named relative to the deepest folder that holds them all."""
    if one_folder:
        found.sort(key=itemgetter(1))  # the usual case: one folder, the paths already relative to it (and distinct)
    else:
        root = os.path.commonpath(roots)
        by_rel: dict[str, Row] = {}
        for absolute, _, size, mtime, group, ctime, ino in found:
            if absolute.startswith(root):
                rel = absolute[len(root):].lstrip(os.sep).replace(os.sep, "/")
            else:
                rel = Path(os.path.relpath(absolute, root)).as_posix()
            by_rel.setdefault(rel, (absolute, rel, size, mtime, group, ctime, ino))
        found = [by_rel[rel] for rel in sorted(by_rel)]
    if not found:
        return []
    check_names(found)
    absolute, rel, size, mtime, group, ctime, ino = zip(*found)
    return list(map(_new, repeat(InputFile), zip(absolute, rel, range(len(found)), size, group, mtime, ctime, ino,
                                                      repeat(""))))


_new = tuple.__new__  # InputFile(*row) without its Python-level __new__: a tenth of the time


# -- listing ahead, in a child process -----------------------------------------------------------

_SOON: dict[str, _Walk] = {}  # absolute folder -> its listing, under way in a child process
_HEAD = struct.Struct("<4sQQQ")  # magic, files, bytes of relative paths, bytes of groups
_MAGIC = b"SSW2"


class _Walk:
    """``_walk(folder, None)`` in a forked child (``engine.processes.forked``), read back through a pipe."""

    def __init__(self, folder: str, *, quiet: bool = True) -> None:
        self.folder = folder

        def listing() -> bytes:
            found = _listed_here(folder, None, None if quiet else _child_progress())
            found.sort(key=itemgetter(1))  # as discover sorts them, so that its sort finds them in order
            return _encode(found)

        self._answer = ForkedAnswer(listing)
        self.pid = self._answer.pid

    def cancel(self) -> None:
        """Stop the child and forget its listing."""
        self._answer.cancel()

    def result(self) -> list[Row] | None:
        """The child's listing, or None when it failed (the caller lists the folder itself, and
        meets the error there)."""
        data = self._answer.result()
        return None if data is None else _decode(self.folder, data)


def _encode(found: list[Row]) -> bytes:
    _, rels, sizes, mtimes, groups, ctimes, inos = zip(*found) if found else ((),) * 7
    rel = "\0".join(rels).encode("utf-8", "surrogateescape")  # names never hold NUL
    group = "\0".join(groups).encode("utf-8", "surrogateescape")
    return b"".join([_HEAD.pack(_MAGIC, len(found), len(rel), len(group)), rel, group,
                     array("q", sizes).tobytes(), array("q", mtimes).tobytes(), array("q", ctimes).tobytes(),
                     array("Q", inos).tobytes()])


def _decode(folder: str, data: bytes) -> list[Row] | None:
    if len(data) < _HEAD.size:
        return None
    magic, n, nrel, ngroup = _HEAD.unpack_from(data)
    if magic != _MAGIC or len(data) != _HEAD.size + nrel + ngroup + 32 * n:
        return None
    if not n:
        return []
    at = _HEAD.size
    rels = data[at:at + nrel].decode("utf-8", "surrogateescape").split("\0")
    groups = data[at + nrel:at + nrel + ngroup].decode("utf-8", "surrogateescape").split("\0")
    if len(rels) != n or len(groups) != n:
        return None
    numbers = array("q", data[at + nrel + ngroup:at + nrel + ngroup + 24 * n])
    inos = array("Q", data[at + nrel + ngroup + 24 * n:])
    prefix = folder if folder.endswith(os.sep) else folder + os.sep  # as scandir joins them
    return list(zip(map(prefix.__add__, rels), rels, numbers[:n].tolist(), numbers[n:2 * n].tolist(), groups,
                    numbers[2 * n:].tolist(), inos.tolist()))


def _walked(folder: str, suffixes: tuple[str, ...], progress: Any = None) -> list[Row]:
    """``_walk(folder, suffixes)``, from the listing ``walk_soon`` started if there is one."""
    soon = _SOON.pop(folder, None)
    found = soon.result() if soon is not None else None
    if found is None:
        return _listed_here(folder, suffixes, progress)
    return [row for row in found if row[1].lower().endswith(suffixes)]


def _listed_here(folder: str, suffixes: tuple[str, ...] | None, progress: Any) -> list[Row]:
    """``_walk``, counting the files it finds on ``progress``'s bar (none: silently)."""
    if progress is None:
        return _walk(folder, suffixes)
    with progress.bar(total=None, desc=f"listing {os.path.basename(folder) or folder}", unit=" files") as bar:
        return _walk(folder, suffixes, bar.update)


def _child_progress() -> Any:
    from shardsmith.core.progress import Progress

    return Progress(quiet=False)


@contextlib.contextmanager
def walk_soon(paths: Sequence[str], *, quiet: bool = True) -> Iterator[None]:
    """Within the block, ``discover`` takes the folders among ``paths`` as a child process listed
    them when the block began (POSIX, and only from a single-threaded process: fork copies no
    other thread). Listings nobody took are reaped when the block ends. Unless ``quiet``, the
    child counts the files it finds on a bar of its own (on the same stderr)."""
    started: list[str] = []
    if hasattr(os, "fork") and sys.platform != "win32" and threading.active_count() == 1:
        for raw in paths:
            folder = os.path.abspath(raw)
            if folder not in _SOON and os.path.isdir(folder):
                try:
                    _SOON[folder] = _Walk(folder, quiet=quiet)
                except OSError:  # no process to spare (EAGAIN, ENOMEM): discover lists it itself
                    continue
                started.append(folder)
    try:
        yield
    finally:
        for folder in started:
            soon = _SOON.pop(folder, None)
            if soon is not None:
                soon.cancel()
