"""Who holds an output prefix: its run record (``RUN_FILE``) as a lease, kept fresh by a heartbeat.

A local output folder is held by a record lock (``outlock``); an object store has none, so a whole
run into ``s3://B/P`` holds the prefix through its run record: the run's identity (command,
options, inputs: ``resume.run_identity``) and its holder (host, pid, a random token, when it
started, and ``beat``: the time of its last heartbeat, rewritten every ``HEARTBEAT_SECONDS`` by a
thread, each write conditional on the ETag of the last: ``If-Match``).

- A record whose holder lives is refused to every other run, ``--overwrite`` or not, in one line
  naming it (the wording of ``outlock``). It lives while its heartbeat is younger than
  ``STALE_SECONDS``; on the holder's own host, boot and pid namespace, while its process runs (so
  the rerun of a killed run takes its record over at once; a container beside us, with the host's
  name but pids of its own, is judged by its heartbeat). A record with no holder (released by a run that stopped,
  or put by cluster stages) holds nothing.
- The record is taken with a conditional put (``If-None-Match: *``, or ``If-Match`` the ETag of
  the dead or stale record read), so of two runs that take it at once one is refused.
- Before the manifest, the run rewrites its record (``If-Match``): a run whose record was taken
  over meanwhile commits nothing (``check``). Taking over needs a stale heartbeat, which a run that
  has just rewritten its record does not have.
- The same ``check`` is the fence's question (``storage/upload.py``): when the store refuses a
  conditional write of the run, is the prefix still its own? The lease is never the fence itself:
  a run frozen right after a check finds its writes refused by the store (``objstore``).

Details: a live holder is refused also before any input is staged, and to a cluster rank; a dead or
stale holder's record is taken over in one line saying so (a killed run's rerun on the same host at
once, elsewhere after 60 s). Both conditional puts are honoured by moto's server, as by AWS S3 since
2024, and ``--overwrite`` deletes objects only after the record is taken. A run that stops keeping
its work (Ctrl-C, an upload that failed) releases the record (rewritten without a holder: the same
command resumes at once); a failed run deletes it if still its own. The rewrite before the commit
recognises its own put whose answer was lost by its token; a run whose record was replaced deletes
nothing, puts no manifest and stops in one line, "lost its prefix to another run …; nothing
committed" (exit 1), and no upload starts once the heartbeat found it lost. Clocks of the machines
are assumed within seconds. Other fsspec schemes (``objstore.Store``) check and put, which is not
atomic.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import secrets
import socket
import sys
import threading
import time
from typing import Any

import orjson

from shardsmith.core.manifest import RUN_FILE
from shardsmith.core.urls import safe_argv
from shardsmith.engine.output.outlock import LockedError, pid_alive, pid_space, process_start
from shardsmith.storage.objstore import Store

HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 60.0
IDENTITY = ("command", "options", "inputs")


def identity(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run a record names (without its holder)."""
    return None if record is None else {k: record.get(k) for k in IDENTITY}


def same_run(record: dict[str, Any] | None, run: dict[str, Any]) -> bool:
    return record is not None and identity(record) == identity(run)


def parse(data: bytes | None) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError):
        found = orjson.loads(data) if data is not None else None
        return found if isinstance(found, dict) else None
    return None


def state(record: dict[str, Any] | None) -> str:
    """``free`` (no record, or no holder), ``live``, ``dead`` (its process is gone: same host, same
    boot and pid namespace, ``outlock.pid_space``) or ``stale`` (no heartbeat for ``STALE_SECONDS``;
    how a holder anywhere else, a container beside us included, is judged)."""
    if record is None or not record.get("token"):
        return "free"
    here = pid_space()
    if record.get("host") == socket.gethostname() and here is not None and record.get("pids") == here:
        pid = record.get("pid")
        if not isinstance(pid, int) or pid == os.getpid():  # (a process runs one session at a time)
            return "dead"
        if not pid_alive(pid):
            return "dead"
        start = process_start(pid)
        return "live" if start is None or record.get("boot") in (None, start) else "dead"
    beat = record.get("beat")
    if not isinstance(beat, (int, float)):
        return "stale"
    return "stale" if time.time() - beat > STALE_SECONDS else "live"


def describe(record: dict[str, Any]) -> str:
    """'pid P on HOST, started T: COMMAND', as ``outlock`` names a holder."""
    return (f"pid {record.get('pid', '?')} on {record.get('host', '?')}, started {record.get('started', '?')}: "
            f"{record.get('command_line') or record.get('command', '?')}")


def refuse_live(store: Store, record: dict[str, Any] | None, *, token: str | None = None) -> None:
    """Refuse a prefix whose record's holder lives (and is not ``token``)."""
    if record is not None and record.get("token") != token and state(record) == "live":
        raise LockedError(f"-o {store.url}: another run is writing into it: {describe(record)}; wait for it to "
                          f"finish, or stop it (the hold of a run that died lapses {STALE_SECONDS:.0f} s after "
                          f"its last heartbeat)")


def taken_over(record: dict[str, Any] | None) -> str | None:
    """One line for a record taken from a holder that died, or None (no holder)."""
    how = state(record)
    if record is None or how not in ("dead", "stale"):
        return None
    if how == "dead":
        why = "which is no longer running"
    else:
        beat = record.get("beat")
        age = f"{time.time() - beat:.0f} s ago" if isinstance(beat, (int, float)) else "never"
        why = f"whose last heartbeat was {age}"
    return f"took the prefix over from a run ({describe(record)}) {why}"


class Hold:
    """This run's hold on a prefix: take it, keep it fresh, check it, let it go."""

    def __init__(self, store: Store, run: dict[str, Any]) -> None:
        self.store = store
        self.record: dict[str, Any] = {
            **identity(run),  # type: ignore[dict-item]
            "host": socket.gethostname(), "pid": os.getpid(), "boot": process_start(os.getpid()),
            "pids": pid_space(), "token": secrets.token_hex(16),
            "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command_line": " ".join(["shardsmith", *safe_argv(sys.argv[1:])])[:300], "beat": time.time()}
        self.token = self.record["token"]
        self.etag: str | None = None  # of the record as we last wrote it; None: not held
        self.lost: dict[str, Any] | None = None  # the record found in place of ours (or {} when gone)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, etag: str | None) -> bool:
        """Put the record in place of the one with ``etag`` (None: where there is none); False if
        another run changed it first."""
        body = orjson.dumps(self.record)
        got = self.store.create(RUN_FILE, body) if etag is None else self.store.replace(RUN_FILE, body, etag)
        if got is None:
            got = self._ours()  # (a put whose answer was lost, retried)
        if got is None:
            return False
        self.etag = got
        self._thread = threading.Thread(target=self._beat, daemon=True, name="shardsmith-heartbeat")
        self._thread.start()
        return True

    def _ours(self) -> str | None:
        """The record's ETag if the record in place is this run's, else None (``lost`` set)."""
        found = self.store.read_tagged(RUN_FILE)
        record = parse(found[0]) if found else None
        if found is not None and record is not None and record.get("token") == self.token:
            return found[1]
        self.lost = record or {}
        return None

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(Exception):  # the store failed us: the next beat tries again
                if not self.refresh():
                    return

    def refresh(self) -> bool:
        """Rewrite the record with a new heartbeat, if it is still ours."""
        with self._lock:
            if self.etag is None:
                return False
            self.record["beat"] = time.time()
            got = self.store.replace(RUN_FILE, orjson.dumps(self.record), self.etag)
            if got is None:
                got = self._ours()
            self.etag = got
            return got is not None

    def check(self) -> None:
        """Immediately before the manifest: the record is still ours (rewritten, so it is fresh),
        else stop in one line: nothing is committed."""
        if self.etag is not None and self.refresh():
            return
        self._halt()
        who = f" ({describe(self.lost)})" if self.lost else " (its run record is gone)"
        raise LockedError(f"-o {self.store.url}: lost its prefix to another run{who} while it uploaded; nothing "
                          f"committed (its manifest was not put)")

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def drop(self) -> None:
        """Remove the record (the run is committed, or failed), if it is still ours: a delete with
        ``If-Match`` its ETag, so another run's record is never removed."""
        self._halt()
        with self._lock:
            if self.etag is not None:
                self.store.delete_known({RUN_FILE: self.etag})
            self.etag = None

    def release(self) -> None:
        """The run stops but keeps its work (interrupted, or an upload failed): the record stays,
        without a holder, so the same command resumes at once (anywhere)."""
        self._halt()
        with self._lock:
            if self.etag is not None:
                with contextlib.suppress(Exception):
                    self.store.replace(RUN_FILE, orjson.dumps(identity(self.record)), self.etag)
            self.etag = None
