"""Files that appear whole or not at all: write to a temporary name, fsync, rename."""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path


def _tmp(path: Path) -> Path:
    """A temporary name beside ``path``, unique per host and process (ranks share cluster filesystems)."""
    return path.with_name(f".{path.name}.tmp-{os.uname().nodename}-{os.getpid()}")


def with_path(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` when it names no file: a write on a full disk says only "No space
    left on device", and the user needs to know which file (so which disk) it was."""
    if exc.filename is not None:
        return exc
    named = OSError(exc.errno, exc.strerror or str(exc), str(path))  # the errno picks the subclass
    named.__cause__ = exc
    return named


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """Re-raise an OSError of the block with ``path`` as its file name, if it has none."""
    try:
        yield
    except OSError as exc:
        named = with_path(exc, path)
        if named is exc:
            raise
        raise named from exc


def fsync_dir(folder: Path) -> None:
    """Make a rename durable: fsync the folder that holds it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash never leaves a partial file under that name."""
    path = Path(path)
    tmp = _tmp(path)
    try:
        with naming(path), open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


class HashingFile:
    """A file written under a temporary name, hashed as it is written, renamed into place on commit.

    Writing and hashing run on two background threads (both release the GIL), so they overlap
    with each other and with the caller preparing the next buffer. Buffers handed to ``write``
    must not change afterwards. The writer thread also flushes to disk every ``sync_bytes``, so
    the fsync of ``commit`` finds little left to do: durability costs disk time while the caller
    computes, not after it.
    """

    sync_bytes = 32 << 20

    def __init__(self, path: Path, *, buffer_bytes: int = 8 << 20, md5: bool = False) -> None:
        self.path = Path(path)
        self._tmp = _tmp(self.path)
        self._fh = open(self._tmp, "wb", buffering=buffer_bytes)  # noqa: SIM115 (closed by commit/abort)
        self._sha = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False) if md5 else None
        self.bytes = 0
        self._unsynced = 0
        self._error: BaseException | None = None
        # two buffers queued per thread at most: overlap without holding many buffers alive
        self._queues: list[queue.Queue[bytes | memoryview | None]] = [queue.Queue(maxsize=2), queue.Queue(maxsize=2)]
        self._threads = [
            threading.Thread(target=self._drain, args=(self._queues[0], self._write_one), daemon=True),
            threading.Thread(target=self._drain, args=(self._queues[1], self._hash_one), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _write_one(self, data: bytes | memoryview) -> None:
        self._fh.write(data)
        self._unsynced += len(data)
        if self._unsynced >= self.sync_bytes:
            self._fh.flush()
            os.fdatasync(self._fh.fileno())
            self._unsynced = 0

    def _hash_one(self, data: bytes | memoryview) -> None:
        self._sha.update(data)
        if self._md5 is not None:
            self._md5.update(data)

    def _drain(self, q: queue.Queue[bytes | memoryview | None], work: Callable[[bytes | memoryview], None]) -> None:
        while (data := q.get()) is not None:
            if self._error is None:
                try:
                    work(data)
                except BaseException as exc:  # surfaced to the caller on the next write or commit
                    self._error = with_path(exc, self.path) if isinstance(exc, OSError) else exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes | memoryview) -> None:
        self._raise()
        if len(data):
            for q in self._queues:
                q.put(data)
            self.bytes += len(data)

    def _finish(self) -> None:
        for q, t in zip(self._queues, self._threads):
            if t.is_alive():
                q.put(None)
                t.join()

    def commit(self) -> str:
        """Flush, fsync and rename; returns the sha256 hex digest."""
        self._finish()
        try:
            self._raise()
            with naming(self.path):
                self._fh.flush()
                os.fsync(self._fh.fileno())
        except BaseException:
            self.abort()
            raise
        self._fh.close()
        os.replace(self._tmp, self.path)
        return self._sha.hexdigest()

    @property
    def md5(self) -> str | None:
        """md5 hex digest (only when asked for), valid after commit."""
        return None if self._md5 is None else self._md5.hexdigest()

    def abort(self) -> None:
        self._finish()
        with contextlib.suppress(OSError):  # closing flushes the buffer: on a full disk that fails again
            self._fh.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()


def file_sha256(fd: int, size: int) -> str:
    """sha256 of the first ``size`` bytes of an open file, read through a memory map (the page
    cache, when the file was just written)."""
    import mmap

    if size == 0:
        return hashlib.sha256().hexdigest()
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
        return hashlib.sha256(mm).hexdigest()
