"""One input folder listed straight to disk (``core/file_listing.py``), sorted by relative path as
``files.discover`` sorts a listing, without ever holding it whole.

The walk's files are cut into runs of ``RUN_FILES``, each sorted in memory and written as a small
listing; runs are merged (``heapq.merge``, at most ``FAN_IN`` at a time, reading ``BLOCK`` files of
each at a time) into the listing, whose indexes are the files' places in it. What stays in memory
is one run, or ``FAN_IN`` blocks: not the file count.
"""

from __future__ import annotations

import heapq
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from shardsmith.core.batched import batched
from shardsmith.core.file_listing import FileListing, ListingWriter
from shardsmith.core.names import not_utf8
from shardsmith.errors import UsageError

# a file found: absolute path, relative path, size, mtime, group, ctime, inode
Row = tuple[str, str, int, int, str, int, int]
TICK_ENTRIES = 4096  # a listing reports its count at least this often (one folder of a million files moves too)
RUN_FILES = 1 << 15  # files sorted in memory at a time (~30 MB of tuples and names)
FAN_IN = 64  # runs merged at a time
BLOCK = 2048  # files read from each run at a time while merging
_REL = itemgetter(1)


def list_folder(folder: str, *, suffixes: tuple[str, ...], dest: Path, progress: Any = None,
                run_files: int | None = None, fan_in: int | None = None) -> FileListing:
    """The files of ``folder`` (``walk_rows``) as a listing in ``dest``, sorted by their
    path relative to ``folder``; the same files, in the same order, as ``discover`` lists.
    ``run_files``, ``fan_in``: ``RUN_FILES`` and ``FAN_IN`` (smaller in the tests)."""
    run_files, fan_in = run_files or RUN_FILES, fan_in or FAN_IN
    prefix = folder if folder.endswith(os.sep) else folder + os.sep  # as scandir joins them
    runs_dir = dest.with_name(dest.name + ".runs")
    shutil.rmtree(runs_dir, ignore_errors=True)
    runs: list[FileListing] = []
    try:
        chunk: list[Row] = []
        for row in _rows(folder, suffixes, progress):
            chunk.append(row)
            if len(chunk) >= run_files:
                runs.append(_run(chunk, runs_dir / str(len(runs))))
                chunk = []
        if not runs:  # the usual case below RUN_FILES files: one sort, no runs on disk
            chunk.sort(key=_REL)
            return _write(chunk, dest=dest, prefix=prefix)
        if chunk:
            runs.append(_run(chunk, runs_dir / str(len(runs))))
        del chunk
        while len(runs) > fan_in:
            runs = [_merged(runs[at:at + fan_in], runs_dir / f"m{len(runs)}-{at}") for at in range(0, len(runs), fan_in)]
        return _write(heapq.merge(*map(_blocks, runs), key=_REL), dest=dest, prefix=prefix)
    finally:
        shutil.rmtree(runs_dir, ignore_errors=True)


def walk_rows(folder: str, suffixes: tuple[str, ...] | None, tick: Callable[[int], Any] | None = None
              ) -> Iterator[Row]:
    """(absolute path, path relative to ``folder`` in POSIX form, size, mtime, group, ctime, inode)
    of every non-hidden file below it whose name ends with one of ``suffixes`` (any case; None: any
    name), one by one as they are found; the group is the first folder of the relative path (""
    for files directly in ``folder``). ``tick``: told the files found, as they are found.

    One ``scandir`` pass per folder: the kind of each entry comes from the folder listing itself,
    and only the files that match are stat'ed (once each, for the size and mtime), so a folder of
    a million images is listed in seconds.
    """
    top = os.stat(folder)
    seen = {(top.st_dev, top.st_ino)}  # symlinked folders are followed once
    stack = [(folder, "", "")]
    found = told = 0
    while stack:
        path, rel, group = stack.pop()
        with os.scandir(path) as entries:
            for entry in entries:
                if tick is not None and found - told >= TICK_ENTRIES:
                    tick(found - told)
                    told = found
                name = entry.name
                if name[0] == ".":
                    continue
                if (suffixes is None or name.lower().endswith(suffixes)) and entry.is_file():  # is_file follows symlinks
                    st = entry.stat()
                    found += 1
                    yield (entry.path, rel + name, st.st_size, st.st_mtime_ns, group, st.st_ctime_ns, st.st_ino)
                elif entry.is_dir():
                    st = entry.stat()
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        stack.append((entry.path, f"{rel}{name}/", group or name))
        if tick is not None and found > told:
            tick(found - told)
            told = found


def check_names(found: Sequence[tuple[Any, ...]]) -> None:
    """(Rows or files: their absolute path first, then their relative one.) Refuse a file whose path below its input root is not valid UTF-8 (Python holds its stray bytes as surrogates): its
    name would name records, keys and manifest entries, which are UTF-8 text. One encode of all the
    paths at once, so a million names cost milliseconds; the first bad one is named with its bytes."""
    try:
        "\0".join(row[1] for row in found).encode()
    except UnicodeEncodeError:
        shown = next(not_utf8(row[0]) for row in found if not_utf8(row[1]) is not None)
        raise UsageError(f"{shown}: the file's name is not valid UTF-8; rename it (records, keys and the manifest "
                         f"name inputs by their paths, in UTF-8)") from None


def _rows(folder: str, suffixes: tuple[str, ...], progress: Any) -> Iterator[tuple[Any, ...]]:
    if progress is None:
        yield from walk_rows(folder, suffixes)
        return
    with progress.bar(total=None, desc=f"listing {os.path.basename(folder) or folder}", unit=" files") as bar:
        yield from walk_rows(folder, suffixes, bar.update)


def _run(chunk: list[Row], folder: Path) -> FileListing:
    chunk.sort(key=_REL)
    writer = ListingWriter(folder=folder, prefix="")
    writer.append_found(chunk)
    return writer.close()


def _merged(runs: list[FileListing], folder: Path) -> FileListing:
    writer = ListingWriter(folder=folder, prefix="")
    for batch in batched(heapq.merge(*map(_blocks, runs), key=_REL), BLOCK * 8):
        writer.append_found(batch)
    for run in runs:
        shutil.rmtree(run.folder, ignore_errors=True)
    return writer.close()


def _blocks(run: FileListing) -> Iterator[Row]:
    for start in range(0, len(run), BLOCK):
        yield from run.found(start, start + BLOCK)


def _write(rows: Iterable[Row], *, dest: Path, prefix: str) -> FileListing:
    """The sorted files as the listing: indexed by place, names checked (``check_names``)."""
    writer = ListingWriter(folder=dest, prefix=prefix)
    for batch in batched(rows, BLOCK * 8):
        try:
            "\0".join([row[1] for row in batch]).encode()
        except UnicodeEncodeError:  # (the rows of a run have no absolute path: the message names it)
            check_names([(prefix + row[1], row[1]) for row in batch])
        writer.append_found(batch)
    return writer.close()
