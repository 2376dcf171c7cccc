"""Waiting for inputs that are still being staged from object storage (``storage/stager.py``).

A run on URL inputs starts once they are listed; a background stager downloads them in the order
the tasks read them. Whoever is about to read a staged input (a worker at the start of a task, the
planner, the tokenizer's sample) calls ``wait_whole`` first: it returns once the file is at its
path -- a download is renamed into place only when whole, so a file that exists is whole -- and
raises the one-line error of the download that stopped the stager. While it waits it says how far
the readers have got (``reached``): the stager keeps its downloads within a budget ahead of that.

The stager lives in the main process and the readers in forked workers, so what they share is in
shared memory (the index readers reached, inherited by every worker forked after it was mapped) and
on disk (the failure, a file the stager writes before it stops).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from collections.abc import Iterable
from pathlib import Path

from shardsmith.core.input_file import InputFile
from shardsmith.core.urls import is_url
from shardsmith.errors import DataError

_REACHED = mmap.mmap(-1, 8)  # MAP_SHARED and anonymous: one int64 seen by this process and its forked workers
_INT = struct.Struct("<q")
_INT.pack_into(_REACHED, 0, -1)
_wanted = mmap.mmap(-1, 1)  # a byte per input: a reader asked for it (shared as ``_REACHED`` is)
_expected: list[int] = []  # inputs the plan says this process's rank reads, in order (a cluster stage)
_failure: Path | None = None  # where the stager of this run says why it stopped (set before workers fork)


def reached() -> int:
    """The highest input index a reader has asked for (-1: none yet)."""
    return int(_INT.unpack_from(_REACHED, 0)[0])


def reach(index: int) -> None:
    if index > reached():  # a race between workers only delays the stager by one poll: they repeat it
        _INT.pack_into(_REACHED, 0, index)


def begin(failure: Path, *, count: int) -> None:
    """A stager of ``count`` inputs starts: readers have reached and asked for nothing yet, and none failed."""
    global _failure, _wanted
    _failure = failure
    failure.unlink(missing_ok=True)
    _INT.pack_into(_REACHED, 0, -1)
    _wanted = mmap.mmap(-1, max(1, count))
    _expected.clear()


def wanted(index: int) -> bool:
    """Whether a reader has asked for input ``index``."""
    return 0 <= index < len(_wanted) and _wanted[index] != 0


def expect(files: Iterable[InputFile]) -> None:
    """The staged inputs this rank's tasks read, in their order: a cluster stage's stager fetches
    these (and what readers ask for), not every input."""
    _expected[:] = list(dict.fromkeys(f.index for f in files if staged(f)))


def expected() -> list[int]:
    return _expected


def fail(url: str, reason: str) -> None:
    """The stager stopped on ``url``: every reader still waiting raises this."""
    if _failure is not None:
        with contextlib.suppress(OSError):  # the scratch folder is gone: the run has ended
            _failure.parent.mkdir(parents=True, exist_ok=True)
            tmp = _failure.with_name(f".{_failure.name}.tmp-{os.getpid()}")
            tmp.write_text(f"{url}\0{reason}")
            os.replace(tmp, _failure)


def failure() -> DataError | None:
    try:
        url, _, reason = _failure.read_text().partition("\0") if _failure is not None else ("", "", "")
    except OSError:
        return None
    return DataError(file=url, reason=reason) if url else None


def staged(f: InputFile) -> bool:
    """Whether ``f`` is a copy staged from a URL (not a local file, nor a URL its source reads in place)."""
    return bool(f.origin) and not is_url(f.path)


def arriving(f: InputFile) -> bool:
    """Whether ``f`` is staged from a URL and not here yet."""
    return staged(f) and not os.path.exists(f.path)


def wait_whole(files: Iterable[InputFile]) -> None:
    """Return once every staged one of ``files`` is whole at its path (local files at once); the
    stager's error if it stopped first. Ctrl-C ends the wait as it ends any sleep."""
    for f in files:
        if not staged(f):
            continue
        reach(f.index)
        if f.index < len(_wanted):
            _wanted[f.index] = 1
        pause = 0.005
        while True:
            if os.path.exists(f.path):
                break
            if (error := failure()) is not None:
                raise error
            time.sleep(pause)
            pause = min(0.05, pause * 2)
