"""One writer per output folder: a run holds a lock on its output for its whole life.

The lock is a POSIX record lock (``fcntl``) on ``.OUT.shardsmith-lock`` beside the output folder.
Why this primitive:

- it is the lock NFS makes coherent between machines (NLM for NFSv3, built into NFSv4) and Lustre
  too when mounted with ``flock``; ``flock(2)`` on NFS is emulated with it anyway;
- the kernel (or the NFS server, when the client's lease lapses) drops it when its process dies,
  even by ``kill -9`` or the out-of-memory killer, so a lock left by a dead run is simply free:
  the next run takes it without ``--overwrite``;
- byte ranges let one file hold both kinds of lock a run needs (below).

A whole run (no ``--stage``) locks byte 0 exclusively. The ranks of a cluster run share the folder
by design: each locks byte 0 *shared* (so no whole run can start meanwhile) and its own byte
(stage, rank) exclusively (so a resubmitted rank cannot run twice at once). That ranks of two
*different* staged runs never mix is checked by the run fingerprints in the scratch folder.

Who holds the lock is written beside it (``.OUT.shardsmith-lock.<slot>.json``: host, pid, start
time, command), so a refused run can name the holder in its one-line error.

Where the file system refuses record locks (``ENOLCK``, ``ENOSYS``, ``EOPNOTSUPP``: NFS without a
lock daemon, Lustre mounted ``noflock``), or with ``SHARDSMITH_LOCK=file``, the lock is the
holder file itself, created with ``O_EXCL`` (atomic on every network file system) and kept fresh
by a heartbeat; a holder file whose process is gone (same host) or whose heartbeat is older than
``STALE_SECONDS`` is taken over.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from shardsmith.core.urls import safe_argv
from shardsmith.errors import ShardsmithError

STAGES = ("scatter", "gather", "finalize", "plan")  # (the index places each stage's locks: new ones last)
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 60.0
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


class LockedError(ShardsmithError):
    """Another run is writing into the same output folder (exit code 1). ``same_unit``: what holds
    it is the same stage and rank (a unit an earlier, killed driver left running on a cluster)."""

    def __init__(self, message: str, *, same_unit: bool = False) -> None:
        super().__init__(message)
        self.same_unit = same_unit


def lock_path(out: Path) -> Path:
    """The lock file of a run into ``out``: beside it, like the scratch folder."""
    out = Path(out).resolve()
    return out.parent / f".{out.name}.shardsmith-lock"


def _slot(stage: str | None, rank: int) -> tuple[str, int]:
    """(name, byte) of a holder: the whole run, or one rank of one stage."""
    if stage is None:
        return "run", 0
    return f"{stage}-{rank}", 1 + STAGES.index(stage) * (1 << 31) + rank


class OutputLock:
    """The lock of one run into one output folder; ``release`` it (or use it as a context manager)."""

    def __init__(self, *, out: Path, stage: str | None = None, rank: int = 0) -> None:
        self.out = Path(out)
        self.stage = stage
        self.rank = rank
        self.path = lock_path(self.out)
        self.slot, self.byte = _slot(stage, rank)
        self._fd: int | None = None
        self._files: list[Path] = []  # holder files of ours, removed on release
        self._beat: threading.Event | None = None

    # -- taking it --------------------------------------------------------------------------------

    def acquire(self) -> OutputLock:
        """Take the lock, or raise LockedError naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if os.environ.get("SHARDSMITH_LOCK") == "file":
            self._acquire_files()
            return self
        try:
            self._acquire_record_locks()
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                raise
            self._close()
            self._acquire_files()
        return self

    def _acquire_record_locks(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            self._fd = fd
            try:
                if self.stage is None:
                    self._lock(fcntl.LOCK_EX, 0, what=None)
                else:
                    self._lock(fcntl.LOCK_SH, 0, what="run")
                    self._lock(fcntl.LOCK_EX, self.byte, what=self.slot)
            except BaseException:
                self._close()
                raise
            # the file we locked must still be the one at the path: a holder that released it may
            # have removed it while we opened it (then lock the new one)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            self._close()
        if self.stage is None:  # alone: holder files of dead runs are stale
            for stale in self.path.parent.glob(f"{self.path.name}.*.json"):
                stale.unlink(missing_ok=True)
        self._write_holder(self._holder_file(self.slot))

    def _lock(self, kind: int, byte: int, *, what: str | None) -> None:
        assert self._fd is not None
        try:
            fcntl.lockf(self._fd, kind | fcntl.LOCK_NB, 1, byte)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            raise LockedError(f"-o {self.out}: {self._describe_holders(what)}; wait for it to finish, or "
                              f"stop it (a lock of a process that died is released by itself)",
                              same_unit=what == self.slot and self.stage is not None) from None

    # -- the fallback: holder files created with O_EXCL --------------------------------------------

    def _acquire_files(self) -> None:
        if self.stage is None:
            others = [p for p in self.path.parent.glob(f"{self.path.name}.*.json")
                      if not p.name.endswith(".run.json") and _live(p)]
            if others:
                raise LockedError(f"-o {self.out}: {self._describe_holders(None)}; wait for it to finish")
            self._exclusive_file(self._holder_file("run"))
        else:
            run = self._holder_file("run")
            if run.exists() and _live(run):
                raise LockedError(f"-o {self.out}: {self._describe_holders('run')}; wait for it to finish")
            self._exclusive_file(self._holder_file(self.slot))
        self._beat = threading.Event()
        threading.Thread(target=self._heartbeat, args=(list(self._files), self._beat), daemon=True,
                         name="shardsmith-lock").start()

    def _exclusive_file(self, path: Path) -> None:
        for _ in range(3):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if _live(path):
                    raise LockedError(f"-o {self.out}: {_describe(path)}; wait for it to finish",
                                      same_unit=path.name.endswith(f".{self.slot}.json") and self.stage is not None) from None
                # stale: move it aside atomically (one taker wins), then try again
                aside = path.with_name(f"{path.name}.stale-{socket.gethostname()}-{os.getpid()}")
                with contextlib.suppress(FileNotFoundError):
                    os.rename(path, aside)
                    aside.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "wb") as fh:
                fh.write(orjson.dumps(self._holder()))
            self._files.append(path)
            return
        raise LockedError(f"-o {self.out}: could not take the lock file {path} (another run takes it too?)")

    @staticmethod
    def _heartbeat(paths: list[Path], stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            for p in paths:
                with contextlib.suppress(OSError):
                    os.utime(p)

    # -- who holds it -------------------------------------------------------------------------------

    def _holder_file(self, slot: str) -> Path:
        return self.path.with_name(f"{self.path.name}.{slot}.json")

    def _holder(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid(), "boot": process_start(os.getpid()),
                "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                "stage": self.stage, "rank": self.rank if self.stage else None,
                "command": " ".join(["shardsmith", *safe_argv(sys.argv[1:])])[:300]}

    def _write_holder(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(orjson.dumps(self._holder()))
        os.replace(tmp, path)
        self._files.append(path)

    def _describe_holders(self, what: str | None) -> str:
        """'another run is writing into it: host, pid, started …' from the holder files (a holder
        that took the lock a moment ago writes its file right after: wait for it a little)."""
        pattern = f"{self.path.name}.{what}.json" if what else f"{self.path.name}.*.json"
        deadline = time.monotonic() + 1.0
        while True:
            found = []
            for p in self.path.parent.glob(pattern):
                with contextlib.suppress(OSError):
                    found.append((p.stat().st_mtime, p))
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return _describe(max(found)[1]) if found else "another run is writing into it"

    # -- letting go ---------------------------------------------------------------------------------

    def release(self) -> None:
        if self._beat is not None:
            self._beat.set()
        for p in self._files:
            p.unlink(missing_ok=True)
        self._files = []
        if self._fd is not None and self.stage is None:
            self.path.unlink(missing_ok=True)  # still ours: nobody else can hold it now
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # releases every record lock of this process on the file
            self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe(path: Path) -> str:
    try:
        h = orjson.loads(path.read_bytes())
        who = f"pid {h['pid']} on {h['host']}, started {h['started']}"
        stage = f" (--stage {h['stage']} rank {h['rank']})" if h.get("stage") else ""
    except (OSError, ValueError, KeyError, TypeError):
        return "another run is writing into it"
    return f"another run is writing into it: {who}{stage}: {h.get('command', '?')}"


def pid_space() -> str | None:
    """Which kernel boot and pid namespace this process's pids belong to ("BOOT_ID:NS_INODE"), or None
    where that cannot be read: two processes with the same host name compare pids only when this is
    the same too (containers on one machine share a host name but not their pids)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid runs here (one of another user's counts: it may not be signalled)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def process_start(pid: int) -> str | None:
    """When a process started (Linux: clock ticks since boot), so a reused pid is not mistaken for it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _live(path: Path) -> bool:
    """Whether a holder file (fallback locks) stands for a running process."""
    try:
        h = orjson.loads(path.read_bytes())
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True  # being written right now
    if not isinstance(h, dict):
        return False
    if h.get("host") == socket.gethostname():
        pid = h.get("pid")
        if not isinstance(pid, int):
            return False
        if not pid_alive(pid):
            return False
        start = process_start(pid)
        return start is None or h.get("boot") in (None, start)
    return age < STALE_SECONDS
