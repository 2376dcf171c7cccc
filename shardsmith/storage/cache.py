"""A bounded local cache of streamed dataset files, shared by every process of a node (issue 15, part 3).

Files are kept by content: ``data/ab/<sha256>``, the sha256 the manifest gives, so a name from a
manifest never becomes a local path, two datasets holding the same bytes share one copy, and a
dataset rewritten at its URL (new sha256s) never meets its old files. Beside each file, a marker
``<sha256>.ok`` says "verified: size, inode, mtime, ctime"; a file whose marker is missing or differs
(a partial copy, a file changed in place, even with its mtime put back: the ctime moves) is never
trusted, but removed and fetched again.

What is and is not covered at rest (issue 26): a write through the file system is seen by the
marker (ctime cannot be set back); bit rot is not, except in files of ``REHASH`` bytes or less (the
indexes and other sidecars, small shards), whose sha256 is checked again the first time each
process takes them. A verified file is made read-only (0444) before it is renamed into place, and
the cache never writes, truncates or appends to a file in place: it only removes or replaces
whole files. So an accidental writer fails (unless it runs as root), but a file truncated while it
is mapped still kills its readers with SIGBUS (inherent to ``mmap``): keep other programs out of
the cache folder. A file that disappears from under the cache (a /tmp cleaner) between a look and
an open is taken as not cached, and fetched again.

Locks are ``flock`` locks on files in the cache folder (one per open file description, so threads
and processes exclude each other alike; they die with their process):

- ``.lock``, held briefly for every change of the folder's contents: room is made, a download is
  committed, a file is taken into use;
- ``locks/<sha256>``, held while that file downloads: one download per file per node, whatever the
  number of DataLoader workers and ranks; the others wait, then find it cached;
- a file in use is held shared (``LOCK_SH``) by every process that has it open or mapped (the
  lock rides on the descriptor a ``mmap`` duplicates, so it lasts as long as the map); eviction
  takes it exclusively without waiting, so a file in use is never evicted.

Room: before a download, under ``.lock``, the folder's files are added up (verified files, their
markers, downloads in progress, which are created at full size) and the least recently used
files not in use are removed until the new file fits in ``limit``. Each process keeps the folder
within its own limit when it adds a file, so a folder shared by processes with different limits
stays within the largest of them, and within a smaller one once its process adds a file. A
download goes to ``tmp/`` under a temporary name held exclusively by its writer; a name whose
lock can be taken belongs to a killed download and is removed. The sha256 is checked once, when
the download is whole, before it is renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from shardsmith.core.sizes import format_size
from shardsmith.errors import DatasetError

ROOM_WAIT = 120.0  # seconds a download waits for room at most
PATIENCE = 2.0  # seconds a download waits for files in use to be let go before it evicts them anyway
LOG_VARIABLE = "SHARDSMITH_CACHE_LOG"  # set to 1: every download appends "sha256 bytes pid" to DOWNLOADS_LOG
DOWNLOADS_LOG = "downloads.log"  # in the cache folder, outside the limit (a diagnostic: what tests count)
REHASH = 4 << 20  # bytes: a cached file this small has its sha256 checked again when a process first takes it


@dataclass(frozen=True)
class Item:
    """A file to cache: its sha256 and size from the manifest, its name as shown, and how to fetch
    it (``fetch(dst)`` writes the file's bytes from ``dst``'s position on to its end)."""

    sha256: str
    size: int
    name: str
    fetch: Callable[[BinaryIO], None]


class ShardCache:
    """The cache in ``root``, kept within ``limit`` bytes. Pickles as its folder and limit (a spawned
    or forked DataLoader worker uses the same folder under the same locks)."""

    def __init__(self, *, root: str | os.PathLike[str], limit: int) -> None:
        self.root = Path(root)
        self.limit = int(limit)
        self.downloads = 0  # by this process: files and bytes
        self.downloaded_bytes = 0
        self._checked: set[tuple[str, str]] = set()  # (sha256, marker) re-hashed by this process
        self._checked_pid = os.getpid()
        self._folders()

    def _folders(self) -> None:
        for sub in ("data", "tmp", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"root": str(self.root), "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(root=state["root"], limit=state["limit"])  # type: ignore[misc]

    # -- asking for a file -----------------------------------------------------------------------

    def path(self, sha256: str) -> Path:
        return self.root / "data" / sha256[:2] / sha256

    def has(self, item: Item) -> bool:
        """Whether the file is cached and verified (it may be evicted a moment later)."""
        return self._trusted(item, remove=False) is not None

    def open(self, item: Item, *, wait: bool = True, queue: bool = True, keep: frozenset[str] = frozenset(),
             release: Callable[[], None] | None = None) -> int | None:
        """A read-only descriptor of the cached file, held in use (``LOCK_SH``) until it and every
        duplicate of it (a ``mmap``'s) are closed; downloaded first when absent. ``keep``: files not
        to evict for it. Without ``wait``, None when there is no room now (the caller reads ranges);
        without ``queue``, None when another thread or process is downloading it (a prefetch).
        ``release``: called once when the download must wait for room, to let go of the files this
        process holds (so that processes waiting for each other's files never wait forever)."""
        fd = self._take_sound(item)
        if fd is not None:
            return fd
        if item.size > self.limit:
            raise DatasetError(f"{item.name}: {format_size(item.size)} ({item.size} bytes) is more than the "
                               f"cache_limit of {format_size(self.limit)} ({self.limit} bytes); give a larger "
                               f"cache_limit")
        lock = _open_in(self, self.root / "locks" / item.sha256)
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # being downloaded by another thread or process
                if not queue:
                    return None
                if release is not None:  # never wait holding files: the downloader may need their room
                    release()
                    release = None
                fcntl.flock(lock, fcntl.LOCK_EX)
            fd = self._take_sound(item)  # another process downloaded it meanwhile
            if fd is not None:
                return fd
            return self._download(item, wait=wait, keep=keep, release=release)
        finally:
            os.close(lock)

    def usage(self) -> int:
        """Bytes the cache folder holds now (files, markers, downloads in progress)."""
        return sum(size for _, size, _ in self._files()) + sum(size for _, size in self._partials())

    # -- inside ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _flock(self, path: Path, how: int) -> Iterator[int]:
        fd = _open_in(self, path)
        try:
            fcntl.flock(fd, how)
            yield fd
        finally:
            os.close(fd)

    def _locked(self) -> contextlib.AbstractContextManager[int]:
        return self._flock(self.root / ".lock", fcntl.LOCK_EX)

    def _trusted(self, item: Item, *, remove: bool = True) -> os.stat_result | None:
        """The cached file's stat when its marker vouches for it; an untrusted copy is removed
        (``remove``: under ``.lock`` only, where no download is being committed)."""
        path = self.path(item.sha256)
        try:
            st = os.stat(path)
        except OSError:  # absent, or its folder removed
            return None
        try:
            marker = (path.parent / f"{item.sha256}.ok").read_text()
        except (OSError, UnicodeDecodeError):
            marker = ""
        if marker != _marker(st) or st.st_size != item.size:
            if remove:
                _remove(path)  # a partial or changed copy: never served, fetched again
            return None
        return st

    def _sound(self, item: Item, fd: int) -> bool:
        """A small file's sha256, checked again the first time this process takes it (bit rot leaves
        the marker true); a larger file is trusted on its marker."""
        if item.size > REHASH:
            return True
        if self._checked_pid != os.getpid():
            self._checked, self._checked_pid = set(), os.getpid()
        seen = (item.sha256, _marker(os.fstat(fd)))
        if seen in self._checked:
            return True
        with os.fdopen(os.dup(fd), "rb") as fh:  # (the duplicate shares the offset: put back at 0)
            sound = hashlib.file_digest(fh, "sha256").hexdigest() == item.sha256
            fh.seek(0)
        if not sound:
            return False
        self._checked.add(seen)
        return True

    def _take_sound(self, item: Item) -> int | None:
        """``_take`` under ``.lock``, then ``_sound`` outside it (a re-hash never holds up the node's
        other readers); a file found rotten is removed (if it is still that file) and not taken."""
        with self._locked():
            fd = self._take(item)
        if fd is None or self._sound(item, fd):
            return fd
        rotten = os.fstat(fd).st_ino
        os.close(fd)
        with self._locked(), contextlib.suppress(OSError):
            if os.stat(self.path(item.sha256)).st_ino == rotten:
                _remove(self.path(item.sha256))  # bit rot: fetched again
        return None

    def _take(self, item: Item) -> int | None:
        """Under ``.lock``: the verified file opened and held in use, its use time set; else None."""
        st = self._trusted(item)
        if st is None:
            return None
        try:
            fd = _open_file(self.path(item.sha256))
        except FileNotFoundError:  # removed since the look (a cleaner): not cached
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if _marker(os.fstat(fd)) != _marker(st):
            os.close(fd)
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path(item.sha256).parent / f"{item.sha256}.ok")  # least recently used: by this time
        return fd

    def _files(self) -> list[tuple[Path, int, float]]:
        """(path, bytes with its marker, last use) of every cached file."""
        out = []
        for folder in _listdir(self.root / "data"):
            for p in _listdir(folder):
                if p.suffix == ".ok":
                    continue
                try:
                    size = p.stat().st_size
                except OSError:
                    continue  # removed meanwhile
                try:
                    mst = (p.parent / f"{p.name}.ok").stat()
                    out.append((p, size + mst.st_size, mst.st_mtime))
                except OSError:
                    out.append((p, size, 0.0))  # no marker: untrusted, first to go
        return out

    def _partials(self) -> list[tuple[Path, int]]:
        """Downloads in progress; those of killed processes (their lock free) are removed."""
        out = []
        for p in _listdir(self.root / "tmp"):
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                out.append((p, os.fstat(fd).st_size))  # its writer is alive
            else:
                p.unlink(missing_ok=True)  # a killed download
            finally:
                os.close(fd)
        return out

    def _make_room(self, need: int, keep: frozenset[str], *, force: bool = False) -> bool:
        """Under ``.lock``: evict least recently used files not in use until ``need`` more bytes fit
        (``force``: files in use too; their users keep reading them, their space is freed when the
        last user lets go)."""
        files = sorted(self._files(), key=lambda f: f[2])
        used = sum(size for _, size, _ in files) + sum(size for _, size in self._partials())
        for path, size, _ in files:
            if used + need <= self.limit:
                break
            if path.name in keep and not force:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # removed meanwhile: its room is free
                _remove(path)
                used -= size
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                if not force:
                    continue  # in use by some process
                _remove(path)
                used -= size
            else:
                _remove(path)
                used -= size
            finally:
                os.close(fd)
        return used + need <= self.limit

    def _download(self, item: Item, *, wait: bool, keep: frozenset[str],
                  release: Callable[[], None] | None = None) -> int | None:
        start = time.monotonic()
        while True:
            with self._locked():
                force = wait and time.monotonic() > start + PATIENCE
                if self._make_room(item.size + len(_MARKER_ROOM), keep | {item.sha256}, force=force):
                    tmp = self.root / "tmp" / f"{item.sha256}.{os.getpid()}.{secrets.token_hex(4)}"
                    self._folders()  # (a cleaner may have removed them)
                    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    os.ftruncate(fd, item.size)  # counted at full size while it downloads
                    break
            if not wait:
                return None
            if release is not None:
                release()  # our own mapped files first: then only other processes' holds are waited for
                release = None
            if time.monotonic() > start + ROOM_WAIT:
                raise DatasetError(f"{item.name}: no room in the cache {self.root} (cache_limit "
                                   f"{format_size(self.limit)}): the cached files are in use by other processes")
            time.sleep(0.05)
        try:
            with os.fdopen(os.dup(fd), "r+b") as fh:
                item.fetch(fh)
                fh.flush()
                if fh.tell() != item.size:
                    raise DatasetError(f"{item.name}: {fh.tell()} bytes downloaded, the manifest says {item.size}")
                os.fsync(fh.fileno())
                fh.seek(0)
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
            if digest != item.sha256:
                raise DatasetError(f"{item.name}: sha256 {digest[:12]}… differs from the manifest's "
                                   f"{item.sha256[:12]}… (a corrupt or changed file); the download was removed")
            os.fchmod(fd, 0o444)  # read-only from now on: never written in place, only removed or replaced
            with self._locked():
                final = self.path(item.sha256)
                final.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.replace(tmp, final)
                except FileNotFoundError:
                    raise DatasetError(f"{item.name}: its download in {tmp.parent} was removed before it was "
                                       f"complete (a cleaner of that folder?); read it again") from None
                marker = final.parent / f"{item.sha256}.ok"
                part = marker.with_name(f".{marker.name}.{os.getpid()}")
                part.write_text(_marker(os.fstat(fd)))
                os.replace(part, marker)
                fcntl.flock(fd, fcntl.LOCK_SH)  # in use by us from now on: never evicted before we map it
                try:
                    ro = os.open(final, os.O_RDONLY)
                except FileNotFoundError:  # removed at once by a cleaner: this descriptor is still the file
                    ro = os.dup(fd)
                fcntl.flock(ro, fcntl.LOCK_SH)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        finally:
            os.close(fd)
        self.downloads += 1
        self.downloaded_bytes += item.size
        if os.environ.get(LOG_VARIABLE) == "1":
            log = os.open(self.root / DOWNLOADS_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(log, f"{item.sha256} {item.size} {os.getpid()}\n".encode())
            finally:
                os.close(log)
        return ro


_MARKER_ROOM = " " * 64  # what a marker may take, reserved with its file


def _marker(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns}\n"


def _open_file(path: Path) -> int:
    """``path`` opened read-only (a seam for the tests' races)."""
    return os.open(path, os.O_RDONLY)


def _listdir(folder: Path) -> list[Path]:
    """The entries of ``folder``; none when it is gone or not a folder."""
    try:
        return list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _open_in(cache: ShardCache, path: Path) -> int:
    """A lock file of the cache opened (created if need be), its folder made again if it was removed."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        cache._folders()
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(f"{path.name}.ok").unlink(missing_ok=True)
