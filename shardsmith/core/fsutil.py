"""Files that appear whole or not at all: write to a temporary name, fsync, rename."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


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


def atomic_write_bytes(path: Path, data: bytes | Iterable[Any]) -> None:
    """Write ``data`` (or its buffers one after another: no joined copy) to ``path`` so that a crash
    never leaves a partial file under that name."""
    path = Path(path)
    tmp = _tmp(path)
    try:
        with naming(path), open(tmp, "wb") as fh:
            for chunk in [data] if isinstance(data, bytes) else data:
                fh.write(chunk)
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

    ``write`` hands buffers to two background threads, one writing, one hashing (both release the
    GIL), so they overlap with each other and with the caller preparing the next buffer; buffers
    handed to ``write`` must not change afterwards. The writer thread also flushes to disk every
    ``sync_bytes``, so the fsync of ``commit`` finds little left to do: durability costs disk time
    while the caller computes, not after it.

    With ``batch_bytes`` the caller builds the file in place instead: ``reserve(n)`` gives it the
    next ``n`` bytes of the file to fill, inside a batch buffer of this object; a full batch is
    hashed by one background thread and written by another while the caller fills the next (three
    buffers,
    reused for the life of the process: no bytes object per piece, no join, no fresh pages, whose
    first touch costs more than a copy on these VMs). Batches go to the disk with ``O_DIRECT``
    where the file system takes it: a large file written once is not copied into the page cache
    (the largest cost of writing it, and memory that other data needs more), and it is on the disk
    when the write returns, so the fsync of ``commit`` has only the last few KB to flush.
    """

    sync_bytes = 32 << 20
    _ALIGN = 4096  # O_DIRECT: buffer address, file offset and length in whole blocks (4 KB covers any disk)

    def __init__(self, path: Path, *, buffer_bytes: int = 8 << 20, md5: bool = False, batch_bytes: int = 0) -> None:
        self.path = Path(path)
        self._tmp = _tmp(self.path)
        self._sha = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False) if md5 else None
        self.bytes = 0
        self._unsynced = 0
        self._error: BaseException | None = None
        self._queues: list[queue.Queue[Any]] = []
        self._threads: list[threading.Thread] = []
        self._batch: _Batch | None = None
        self._batch_bytes = batch_bytes
        self._direct = False
        if batch_bytes:
            self._fh = open(self._tmp, "wb", buffering=0, opener=_direct_opener)  # noqa: SIM115 (closed by commit/abort)
            self._direct = _is_direct(self._fh)
            self._free: queue.Queue[_Batch] = queue.Queue()
            self._owned: list[_Batch] = []
            self._users = threading.Lock()  # guards each batch's count of threads still using it
            # one thread hashes and one writes each batch, in parallel (sha256 and the disk each
            # take about as long: one after the other they halved the rate)
            self._queues = [queue.Queue(), queue.Queue()]
            self._threads = [
                threading.Thread(target=self._drain, args=(self._queues[0], self._write_batch), daemon=True),
                threading.Thread(target=self._drain, args=(self._queues[1], self._hash_batch), daemon=True),
            ]
            for t in self._threads:
                t.start()
            return
        self._fh = open(self._tmp, "wb", buffering=buffer_bytes)  # noqa: SIM115 (closed by commit/abort)
        # two buffers queued per thread at most: overlap without holding many buffers alive
        self._queues = [queue.Queue(maxsize=2), queue.Queue(maxsize=2)]
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

    def _drain(self, q: queue.Queue[Any], work: Callable[[Any], None]) -> None:
        while (data := q.get()) is not None:
            if self._error is None:
                try:
                    work(data)
                except BaseException as exc:  # surfaced to the caller on the next write or commit
                    self._error = with_path(exc, self.path) if isinstance(exc, OSError) else exc
            if isinstance(data, _Batch):
                self._release_batch(data)  # even after an error: the caller may be waiting for a buffer

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes | memoryview) -> None:
        self._raise()
        if not len(data):
            return
        if self._batch_bytes:
            view = memoryview(data).cast("B")
            for i in range(0, len(view), self._batch_bytes):
                piece = view[i:i + self._batch_bytes]
                self.reserve(len(piece))[:] = piece
            return
        for q in self._queues:
            q.put(data)
        self.bytes += len(data)

    # ---------------------------------------------------------------- batch mode

    def reserve(self, n: int) -> memoryview:
        """The next ``n`` bytes of the file, to fill before the next call to ``reserve``, ``write``
        or ``commit`` (batch mode only)."""
        self._raise()
        batch = self._batch
        if batch is None or batch.end + n > len(batch.view):
            batch = self._next_batch(n)
        start = batch.end
        batch.end += n
        self.bytes += n
        return batch.view[start:start + n]

    def _next_batch(self, n: int) -> _Batch:
        """Hand the current batch to the writer thread; the next one starts with its unaligned tail."""
        old = self._batch
        carry = 0
        if old is not None:
            carry = old.end % self._ALIGN if self._direct else 0
            old.stop = old.end - carry  # decided here, so the writer thread and this one agree on it
            self._hand_on(old)
        need = carry + n
        batch = self._take(need)
        if carry:
            assert old is not None
            batch.view[:carry] = old.view[old.end - carry:old.end]  # the writer only reads ``old``
        batch.new = batch.end = carry
        self._batch = batch
        return batch

    def _take(self, need: int) -> _Batch:
        size = self._batch_bytes + self._ALIGN  # room for the tail carried over
        if need > size:
            return _Batch.mapped(need)  # one piece larger than a batch: its own buffer, used once
        if len(self._owned) < 3:
            batch = _Batch.pooled(size)
            self._owned.append(batch)
            return batch
        batch = self._free.get()
        self._raise()
        return batch

    def _hand_on(self, batch: _Batch) -> None:
        """A filled batch to the writer and the hasher; it is free again when both are done."""
        batch.users = 2
        for q in self._queues:
            q.put(batch)

    def _release_batch(self, batch: _Batch) -> None:
        with self._users:
            batch.users -= 1
            done = batch.users == 0
        if done:
            self._free.put(batch)

    def _write_batch(self, batch: _Batch) -> None:
        """On the writer thread: the batch's whole blocks (or everything, without O_DIRECT)."""
        self._write_all(batch.view[:batch.stop])

    def _hash_batch(self, batch: _Batch) -> None:
        """On the hashing thread: the batch's new bytes."""
        self._hash_one(batch.view[batch.new:batch.end])

    def _write_all(self, view: memoryview) -> None:
        done = 0
        while done < len(view):  # a raw write may take part of the buffer
            try:
                done += self._fh.write(view[done:]) or 0
            except OSError as exc:
                if not (self._direct and exc.errno == errno.EINVAL):
                    raise
                self._no_direct()  # the file system took O_DIRECT at open but not at write: write through the cache
        if not self._direct:
            self._unsynced += len(view)
            if self._unsynced >= self.sync_bytes:
                os.fdatasync(self._fh.fileno())
                self._unsynced = 0

    def _no_direct(self) -> None:
        import fcntl

        fd = self._fh.fileno()
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~getattr(os, "O_DIRECT", 0))
        self._direct = False

    def _flush_batches(self) -> None:
        """Batch mode, at commit: the last batch, then its unaligned tail through the page cache."""
        batch = self._batch
        if batch is None:
            return
        self._batch = None
        batch.stop = batch.end - (batch.end % self._ALIGN if self._direct else 0)
        self._hand_on(batch)
        self._finish()
        self._raise()
        if batch.stop < batch.end:
            self._no_direct()
            self._write_all(batch.view[batch.stop:batch.end])

    # ----------------------------------------------------------------

    def _finish(self) -> None:
        for q, t in zip(self._queues, self._threads):
            if t.is_alive():
                q.put(None)
                t.join()

    def commit(self) -> str:
        """Flush, fsync and rename; returns the sha256 hex digest."""
        try:
            with naming(self.path):
                if self._batch_bytes:
                    self._flush_batches()
                self._finish()
                self._raise()
                self._fh.flush()
                os.fsync(self._fh.fileno())
        except BaseException:
            self.abort()
            raise
        self._fh.close()
        os.replace(self._tmp, self.path)
        self._release()
        return self._sha.hexdigest()

    @property
    def md5(self) -> str | None:
        """md5 hex digest (only when asked for), valid after commit."""
        return None if self._md5 is None else self._md5.hexdigest()

    def abort(self) -> None:
        if self._error is None:
            self._error = _Aborted()  # queued batches are not written
        self._finish()
        with contextlib.suppress(OSError):  # closing flushes the buffer: on a full disk that fails again
            self._fh.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()
        self._release()

    def _release(self) -> None:
        """Batch buffers back to the process's pool, for the next file (no fresh pages)."""
        if self._batch_bytes and not any(t.is_alive() for t in self._threads):
            with _POOL_LOCK:
                for batch in self._owned:
                    _POOL.setdefault(len(batch.view), []).append(batch)
            self._owned = []


class _Aborted(Exception):
    """The file was abandoned: batches still queued are dropped."""


_POOL: dict[int, list[_Batch]] = {}
_POOL_LOCK = threading.Lock()


class _Batch:
    """A page-aligned buffer (anonymous memory map) and how much of it is filled."""

    __slots__ = ("end", "new", "stop", "users", "view")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.new = 0  # bytes before this are the previous batch's unaligned tail, already hashed
        self.end = 0  # filled up to here
        self.stop = 0  # written up to here (the rest goes with the next batch)
        self.users = 0  # background threads (writer, hasher) not yet done with it

    @classmethod
    def mapped(cls, size: int) -> _Batch:
        import mmap

        if not hasattr(mmap, "MAP_PRIVATE"):  # Windows: no O_DIRECT either, so no alignment to keep
            return cls(memoryview(bytearray(size)))
        # private: a shared map (mmap's default) would be one buffer for every process forked later
        return cls(memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)))

    @classmethod
    def pooled(cls, size: int) -> _Batch:
        with _POOL_LOCK:
            free = _POOL.get(size)
            if free:
                return free.pop()
        return cls.mapped(size)


def _direct_opener(path: str, flags: int) -> int:
    """``open`` with O_DIRECT where there is such a flag and the file system takes it."""
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct, 0o666)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o666)


def _is_direct(fh: Any) -> bool:
    try:
        import fcntl

        return bool(fcntl.fcntl(fh.fileno(), fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0))
    except (ImportError, OSError, AttributeError):
        return False


def file_sha256(fd: int, size: int) -> str:
    """sha256 of the first ``size`` bytes of an open file, read through a memory map (the page
    cache, when the file was just written)."""
    import mmap

    if size == 0:
        return hashlib.sha256().hexdigest()
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
        return hashlib.sha256(mm).hexdigest()
