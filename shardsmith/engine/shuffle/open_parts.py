"""The part files one reader goes through, each opened once while it reads them.

Why (issue 43): a gather range reads its groups one after another, and a group has a segment in most
part files; opening each part again for every group made a gather unit open its parts (groups x
parts) times: millions of opens a unit at 1 TB, each a round trip to a shared file system's
metadata server. Here a gather range (``gather._write_run``) and the planning of a split
(``shard_plan.plan_split``) each keep the parts they read open until they are done (read with
``os.preadv``: one call per segment, heads and payload together, no file position).

Descriptors are limited (``RLIMIT_NOFILE``; the soft limit is raised to the hard one, as far as
``MAX_OPEN``): at most half of that is kept. Past it, a part not yet open is opened for its read and
closed again, never one kept open let go: a gather reads its parts in the same order group after
group, which a least-recently-used policy would turn into an open for every read.
"""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Any

MAX_OPEN = 65536


def descriptor_budget() -> int:
    """Descriptors a reader may keep: half of the soft limit, raised first towards the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_OPEN if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    return max(8, min(MAX_OPEN, soft if soft != resource.RLIM_INFINITY else MAX_OPEN) // 2)


class OpenParts:
    """Descriptors of part files by path, kept until ``close`` (at most ``limit``). ``writable``:
    opened for reading and writing, for a gather range that gives its spill back as it goes
    (``release.punch`` then punches through the descriptor its reads use: one open, not two)."""

    def __init__(self, *, limit: int | None = None, writable: bool = False) -> None:
        self._fds: dict[str, int] = {}
        self.limit = descriptor_budget() if limit is None else limit
        self._flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        self.writable = writable
        self.opens = 0  # how many times a part was opened (what the descriptors kept save)

    def _kept(self, path: str) -> tuple[int, bool]:
        """``path``'s descriptor, and whether it is kept (else the caller closes it)."""
        fd = self._fds.get(path)
        if fd is not None:
            return fd, True
        fd = os.open(path, self._flags)
        self.opens += 1
        if len(self._fds) < self.limit:
            self._fds[path] = fd
            return fd, True
        return fd, False

    def read_into(self, path: str, buffers: list[Any], offset: int) -> int:
        """Fill ``buffers`` (writable byte buffers, one after another) from ``path`` at ``offset``;
        the bytes read (fewer: the file ends before)."""
        fd, kept = self._kept(path)
        try:
            return _pread_all(fd, buffers, offset)
        finally:
            if not kept:
                os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        """A copy sent to another process (spawned, not forked) holds no descriptor: numbers of this
        process's would name other files there; it opens its own. A forked worker inherits this one
        whole, descriptors and all."""
        return {**self.__dict__, "_fds": {}}

    def open_all(self, paths: list[str]) -> None:
        """Open ``paths`` now (as many as the limit keeps; one already open stays as it is): before
        worker processes fork, so that each part is opened once for all of them."""
        for path in paths:
            if len(self._fds) >= self.limit:
                break
            fd, kept = self._kept(path)
            if not kept:
                os.close(fd)

    def writable_fd(self, path: str) -> int | None:
        """``path`` open for writing and kept open (None: not writable, or no descriptor to spare)."""
        if not self.writable:
            return None
        fd, kept = self._kept(path)
        if not kept:
            os.close(fd)
            return None
        return fd

    def close(self) -> None:
        """Every descriptor closed."""
        fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> OpenParts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pread_all(fd: int, buffers: list[Any], offset: int) -> int:
    """``os.preadv`` until the buffers are full or the file ends; the bytes read."""
    want = sum(memoryview(b).nbytes for b in buffers)
    got = os.preadv(fd, buffers, offset)
    while 0 < got < want:  # a read the kernel cut short goes on from where it stopped
        views, skip = [], got
        for b in buffers:
            mv = memoryview(b).cast("B")
            if skip >= mv.nbytes:
                skip -= mv.nbytes
                continue
            views.append(mv[skip:])
            skip = 0
        more = os.preadv(fd, views, offset + got)
        if more == 0:
            break
        got += more
    return got
