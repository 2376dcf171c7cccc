"""Uploading a staged dataset while it is made: each finished file goes up as soon as it appears.

The local pipeline writes every output file under a temporary name and renames it into place
when whole, so a file seen under its final name in the staging folder is finished. A poller
thread hands such files to a pool of upload threads while the conversion goes on; ``finish``
uploads what is left once the manifest is written locally, and uploads again any file that was
replaced after its upload began (a split-wide index rewritten at the end). An object already
there with the file's size and checksum (a resumed run) is not uploaded again.

Every upload is fenced (``objstore``): a new object is put only where there is none, an object is
replaced only if it still has the ETag this run knows (listed at its claim, or written by it).
When the store says an object changed under the run (``Changed``), ``fence`` asks whether the
prefix is still this run's: if not (the run was frozen while another took the prefix over), it
stops, having written nothing over the other run's objects; if so (the object was left by a run
that lost the prefix), it is replaced once more, conditionally.

The poller looks every 0.5 s; what it hands on is ``published``: a file the run's formats own
(``registry.own_files``; its key is its relative path), never the manifest, the run record or a
temporary file; 4 threads upload. A file whose (size, mtime, inode) changed after its upload began is uploaded again by
``finish``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from shardsmith.core.faults import crash_point
from shardsmith.core.manifest import MANIFEST, RUN_FILE
from shardsmith.core.own_files import OwnFiles
from shardsmith.errors import ShardsmithError
from shardsmith.storage.objstore import Changed, ObjectInfo, Store

THREADS = 4  # files uploaded at once; each holds one part in memory
POLL_SECONDS = 0.5

Stamp = tuple[int, int, int]  # size, mtime_ns, inode: a file replaced by a rename has a new one


def publishable(rel: str, own: OwnFiles) -> bool:
    """A dataset file of the staging folder, by its relative path (not the manifest, which goes last,
    nor run state or a temporary file, nor a file in a temporary folder); ``own``: what the run's
    formats may write (the caller asks the registry: ``registry.own_files``)."""
    return rel not in (MANIFEST, RUN_FILE) and not any(part.startswith(".") for part in rel.split("/")) \
        and own.owns(rel)


def published(folder: Path, own: OwnFiles) -> list[str]:
    """The dataset files of a staging folder to upload, by their relative paths (the object keys)."""
    return [rel for rel in own.listed(folder) if publishable(rel, own)]


def _stamp(path: Path) -> Stamp | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


class Uploader:
    """The uploads of one run's staging folder into its store."""

    def __init__(self, *, store: Store, folder: Path, remote: dict[str, ObjectInfo], own: OwnFiles,
                 threads: int = THREADS, held: Callable[[], bool] | None = None,
                 fence: Callable[[], None] | None = None) -> None:
        self.store = store
        self.own = own  # which files of the folder are the dataset's (``core/own_files.py``)
        self.held = held  # whether the prefix is still this run's as far as it knows: else no upload starts
        self.fence = fence  # asks the store whether it is still this run's; raises if not (``outhold``)
        self.folder = folder
        self.remote = dict(remote)  # each object as this run knows it: listed at the claim, or written by it
        self.resumable = store.uploads()  # unfinished multipart uploads, newest first
        self.sent = 0  # files uploaded (not found there already)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shardsmith-upload")
        self._lock = threading.Lock()
        self._running: dict[str, Future[None]] = {}
        self._done: dict[str, Stamp] = {}  # name -> the stamp of the file its object holds
        self._errors: list[BaseException] = []
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._closed = False
        self._finishing = False

    def start(self) -> Uploader:
        self._poller = threading.Thread(target=self._poll, daemon=True, name="shardsmith-upload-poll")
        self._poller.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._scan()

    def _scan(self) -> None:
        """Hand every finished file not uploaded as it is now (and not being uploaded) to the pool."""
        try:
            names = published(self.folder, self.own)
        except FileNotFoundError:
            return
        with self._lock:
            for name in names:
                stamp = _stamp(self.folder / name)
                if stamp is None or self._done.get(name) == stamp or name in self._running:
                    continue
                if self._closed:
                    return
                self._running[name] = self._pool.submit(self._one, name, stamp)

    def _one(self, name: str, stamp: Stamp) -> None:
        try:
            if self._errors or self._stop.is_set() and not self._finishing:
                return
            if self.held is not None and not self.held():
                raise ShardsmithError(f"{self.store.show(name)}: not uploaded: the prefix is another run's now")
            known = self.remote.get(name)
            resumable = self.resumable.pop(name, [])
            try:
                got = self.store.upload(name, self.folder / name, known=known, resumable=resumable)
            except Changed:
                if self.fence is None:
                    raise
                self.fence()  # the prefix is another run's now: stop here, nothing of theirs replaced
                known = self.store.head(name)  # left by a run that lost the prefix (or another tool): replaced
                got = self.store.upload(name, self.folder / name, known=known, resumable=[])
            except ShardsmithError:
                if self.fence is not None:
                    self.fence()  # (an upload aborted by a run that took the prefix over: said as such)
                raise
            if got is not None:
                with self._lock:
                    self.sent += 1
                crash_point("uploaded")
            with self._lock:
                now = got if got is not None else known  # (None only when nothing was there and nothing put)
                if now is not None:
                    self.remote[name] = now  # a later version of the file replaces this one, and only it
                self._done[name] = stamp
        except BaseException as exc:
            self._errors.append(exc)
        finally:
            with self._lock:
                self._running.pop(name, None)

    def finish(self) -> set[str]:
        """Upload everything the staging folder holds (until no file changed meanwhile); returns
        the names of the dataset's objects. Raises the first upload's error."""
        self._finishing = True
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
        while True:
            self._scan()
            with self._lock:
                running = list(self._running.values())
            for future in running:
                future.result()
            if self._errors:
                self.close()
                raise self._errors[0]
            names = set(published(self.folder, self.own))
            with self._lock:
                if all(self._done.get(n) == _stamp(self.folder / n) for n in names) and not self._running:
                    break
        self.close()
        return names

    def close(self) -> None:
        """Stop: no new upload starts; those under way end after their current request."""
        self._stop.set()
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()
