"""Where a dataset's files come from: what the datasets ask for "shard s, whole" or "bytes [a, b) of
shard s", so that no dataset knows whether it reads a folder or a URL.

``LocalFiles``: a folder on this machine; the files are opened in place, checked against the
identities taken when the dataset was opened (``core/identity.py``), and mapped as always.

``StreamedFiles``: a dataset at a URL (``storage/streamed.py``) with a bounded local cache
(``storage/cache.py``). A shard is read whole from the cache when it is there, or when it is among
the next shards of this process's epoch (``plan``: the order a dataset's ``iter`` or a torch adapter
walks), which a background thread downloads a few ahead; any other shard of a tar or token
dataset is read by byte ranges (HTTP Range), so random access never downloads whole shards.
Datasets report what they read (``touched``), so the window of shards moves on as the epoch does.
Every byte comes from the version of the dataset opened: the store pins each object when it reads
the manifest (S3: ``If-Match`` on every GET, ``storage/streamed.py``), the cache keeps files by sha256.

A shard whose size differs from the manifest's is refused when the dataset is opened, on a folder and
at a URL alike; opened with ``on_error="skip"`` (``shardsmith.open``) it is refused when it is first
read instead (``Refused``), so the loader's skip policy (``kit/skips.py``) skips its samples and the
other shards serve theirs.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.identity import Stamp, open_checked, stamp
from shardsmith.errors import DatasetError
from shardsmith.kit import manifest_io
from shardsmith.kit.refused_shards import Refused
from shardsmith.storage.cache import Item, ShardCache
from shardsmith.storage.streamed import RemoteStore

AHEAD = 2  # shards prefetched ahead of the one being read
KEEP_OPEN = 2  # streamed shards a process keeps mapped (each held in the cache while mapped)


class LocalFiles:
    """A dataset folder on this machine."""

    streamed = False
    keep_open: int | None = None  # every shard stays mapped once opened

    def __init__(self, out_dir: str | os.PathLike[str], *, on_error: str = "raise") -> None:
        self.root = Path(out_dir)
        self.where = str(out_dir)
        self.refused = Refused(on_error)

    def load_manifest(self) -> dict[str, Any]:
        return manifest_io.load(self.root)

    def load_split(self, *, fmt: str, split: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The manifest and the split's shard entries; each shard's path and identity, taken now."""
        self.manifest, self.entries = manifest_io.load_split(self.root, fmt=fmt, split=split)
        self.names: list[Any] = [manifest_mod.resolve_inside(self.root, e["path"]) for e in self.entries]
        self.stamps = [self.refused.sized(s, lambda p=path, e=e: stamp(p, size=e["bytes"]))
                       for s, (path, e) in enumerate(zip(self.names, self.entries))]
        return self.manifest, self.entries

    def open(self, s: int, *, release: Any = None) -> int:
        """A read-only descriptor of shard s, the file the dataset was opened on."""
        self.refused.check(s)
        return open_checked(self.names[s], self.stamps[s])

    def local(self, s: int, *, release: Any = None) -> tuple[Path, Stamp, int | None]:
        """Shard s as a local path, its identity, and a descriptor to close when done with it (None)."""
        self.refused.check(s)
        return self.names[s], self.stamps[s], None

    def whole(self, s: int) -> bool:
        return True

    def name_of(self, rel: str) -> Path:
        """A dataset file the manifest names, as a path inside the folder (anything else refused)."""
        return manifest_mod.resolve_inside(self.root, rel)

    def stamp_of(self, path: Path) -> Stamp | None:
        return stamp(path)

    def sidecar(self, entry: dict[str, Any], *, want: Stamp | None = None) -> bytes:
        """A small file of the dataset (an index) whole: of the manifest's size, or (``want``) the
        file the dataset was opened on."""
        path = self.name_of(entry["path"])
        if want is None:
            if not path.is_file() or path.stat().st_size != entry["bytes"]:
                raise DatasetError(f"{path}: missing or not {entry['bytes']} bytes as the manifest says")
            return path.read_bytes()
        fd = open_checked(path, want)
        try:
            with os.fdopen(fd, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise DatasetError(f"{path}: cannot read the index ({exc.strerror or exc})") from None

    def plan(self, shards: np.ndarray, *, release: Callable[[], None] | None = None) -> None:
        """The shards this process reads next, in order: nothing to fetch here."""

    def touched(self, s: int, n: int = 1) -> None:
        """``n`` items of shard s were read."""

    def track(self, s: int, read: Any) -> Any:
        return read

    def let_go(self) -> None:
        """Nothing held here (a streamed dataset's files let go of the shards they hold)."""


class StreamedFiles:
    """A dataset at a URL, read through a bounded cache. Pickles without its thread and plan."""

    streamed = True
    keep_open: int | None = KEEP_OPEN

    def __init__(self, store: RemoteStore, cache: ShardCache, *, ahead: int = AHEAD, on_error: str = "raise") -> None:
        self.store = store
        self.cache = cache
        self.ahead = ahead
        self.refused = Refused(on_error)
        self.where = store.where
        self.ranged_bytes = 0  # fetched by byte ranges in this process
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._left: np.ndarray | None = None  # items of each shard the plan still reads
        self._seq: list[int] = []  # the plan's shards in the order first read
        self._head = 0
        self._failed: set[int] = set()  # shards the prefetcher could not fetch in this plan
        self._held: dict[int, int] = {}  # shard -> descriptor ``whole`` took for the ``open`` that follows

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_lock", "_wake", "_thread", "_left", "_seq", "_head", "_pid", "_held", "_failed")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _mine(self) -> None:
        if self._pid != os.getpid():  # a forked worker: the parent's thread, locks and descriptors are not ours
            for fd in self._held.values():
                os.close(fd)  # our copy: the parent's hold stays
            self._reset()

    # -- what the datasets ask -------------------------------------------------------------------

    @property
    def root(self) -> str:
        return self.where

    def name_of(self, rel: str) -> str:
        self.store.key(rel)  # refused unless below the prefix
        return self.store.name(rel)

    def stamp_of(self, path: Any) -> Stamp | None:
        return None  # the cache vouches for its copies (sha256 and marker)

    def load_manifest(self) -> dict[str, Any]:
        """The manifest, fetched once (a dataset opened from this object reads the same)."""
        if getattr(self, "manifest", None) is None:
            manifest = self.store.manifest()
            manifest_io.validate(manifest, where=self.store.name(manifest_mod.MANIFEST))
            self.manifest = manifest
        return self.manifest

    def load_split(self, *, fmt: str, split: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        self.load_manifest()
        self.entries = manifest_mod.split_of(self.manifest, fmt=fmt, split=split, where=self.where)
        self.names = [self.store.name(e["path"]) for e in self.entries]
        for e in self.entries:
            self.store.key(e["path"])  # every name stays below the prefix: refused now, not mid-epoch
        # each shard of the manifest's size, as a local open checks (ranged reads trust the offsets)
        for s, e in enumerate(self.entries):
            self.refused.sized(s, lambda e=e: self.store.expect({e["path"]: e["bytes"]}))
        return self.manifest, self.entries

    def item(self, entry: dict[str, Any]) -> Item:
        rel, size = entry["path"], entry["bytes"]
        return Item(sha256=entry["sha256"], size=size, name=self.store.name(rel),
                    fetch=lambda dst: self.store.download(rel, dst, size))

    def open(self, s: int, *, release: Any = None) -> int:
        """Shard s from the cache (downloaded first when absent), held there until closed: the
        descriptor ``whole`` took, if it did (so nothing evicts it in between). ``release``: the
        dataset's way to let go of the shards it maps, should the download wait for room."""
        self.refused.check(s)
        fd = self._held.pop(s, None)
        if fd is None:
            def let_go() -> None:
                self.let_go()
                if release is not None:
                    release()

            fd = self.cache.open(self.item(self.entries[s]), keep=self._keep(), release=let_go)
        assert fd is not None
        return fd

    def local(self, s: int, *, release: Any = None) -> tuple[Path, Stamp, int | None]:
        fd = self.open(s, release=release)
        return self.cache.path(self.entries[s]["sha256"]), Stamp.of(os.fstat(fd)), fd

    def whole(self, s: int) -> bool:
        """Whether to read shard s whole: cached, or among the next shards of the plan (then
        downloaded now, if the cache has room for it without waiting)."""
        self._mine()
        self.refused.check(s)
        item = self.item(self.entries[s])
        if s in self._held:
            return True
        window = self._window()
        if self.cache.has(item) or s in window:
            # held for the ``open`` that follows; never waiting for room, and behind another download
            # only for the shard being read now (the prefetcher's, most likely)
            fd = self.cache.open(item, wait=False, queue=bool(window) and s == window[0], keep=self._keep(),
                                 release=self.let_go)
            if fd is not None:
                self._held[s] = fd
                return True
        return False

    def sidecar(self, entry: dict[str, Any], *, want: Stamp | None = None) -> bytes:
        """A small file of the dataset (an index) whole, through the cache: its sha256 checked."""
        fd = self.cache.open(self.item(entry))
        assert fd is not None
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    def read(self, s: int, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of shard s by a ranged read."""
        self.refused.check(s)
        data = self.store.read(self.entries[s]["path"], start, end)
        self.ranged_bytes += len(data)
        return data

    def read_ranges(self, s: int, starts: list[int], ends: list[int]) -> list[bytes]:
        self.refused.check(s)
        got = self.store.read_ranges(self.entries[s]["path"], starts, ends)
        self.ranged_bytes += sum(len(g) for g in got)
        return got

    def let_go(self) -> None:
        """Close the descriptors ``whole`` took and no ``open`` used: the cache may evict those files."""
        self._mine()
        for k in list(self._held):
            os.close(self._held.pop(k))

    def track(self, s: int, read: Any) -> Any:
        """A shard reader that reports each item it reads (``touched``)."""
        def counted(j: int, look: bool = True) -> Any:
            self.touched(s)
            return read(j, look)

        return counted

    # -- the plan and the prefetching thread ------------------------------------------------------

    def plan(self, shards: np.ndarray, *, release: Callable[[], None] | None = None) -> None:
        """This process's coming reads, as the shard of each item in order: the prefetcher
        downloads the first shards of that order (a few ahead of the reader) within the limit.
        ``release``: the dataset lets go of the shards it maps first (a new epoch starts), so the
        previous order's shards never hold room the new one's need."""
        self._mine()
        if release is not None:
            release()
        shards = np.asarray(shards, dtype=np.int64)
        uniq, first = np.unique(shards, return_index=True)
        with self._lock:
            self._left = np.bincount(shards, minlength=len(self.entries)).astype(np.int64)
            self._seq = uniq[np.argsort(first, kind="stable")].tolist()
            self._head = 0
            self._failed = set()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._prefetch, name="shardsmith-prefetch", daemon=True)
            self._thread.start()
        self._wake.set()

    def touched(self, s: int, n: int = 1) -> None:
        left = self._left
        if left is None or self._pid != os.getpid():
            return
        with self._lock:
            left[s] -= n
            moved = False
            while self._head < len(self._seq) and left[self._seq[self._head]] <= 0:
                self._head += 1
                moved = True
        if moved:
            self._wake.set()

    def _window(self) -> list[int]:
        """The next shards of the plan not read to the end yet: the current one and ``ahead`` more,
        and more while they add up to a quarter of the cache's limit at most (so that four
        processes sharing the cache fit in it; a dataset that small is read whole in any order)."""
        self._mine()
        with self._lock:
            if self._left is None:
                return []
            out, total, room = [], 0, self.cache.limit // 4
            for s in itertools.islice(self._seq, self._head, None):
                if self._left[s] > 0:
                    total += self.entries[s]["bytes"]
                    if len(out) > self.ahead and total > room:
                        break
                    out.append(s)
            return out

    def _keep(self) -> frozenset[str]:
        return frozenset(self.entries[s]["sha256"] for s in self._window())

    def _prefetch(self) -> None:
        """Download the window's shards that are not cached, in order, without waiting for room;
        errors are left for the reader to meet (and raise) when it reaches the shard."""
        while True:
            self._wake.wait()
            self._wake.clear()
            for s in self._window():
                if s in self._failed:
                    continue
                try:
                    fd = self.cache.open(self.item(self.entries[s]), wait=False, queue=False, keep=self._keep())
                except Exception:  # noqa: BLE001  (the reader raises it, in its own process and thread)
                    self._failed.add(s)  # not again in this plan: the reader meets the error itself
                    continue
                if fd is not None:
                    os.close(fd)


def files_for(where: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
              cache_limit: int | str | None = None, ahead: int = AHEAD, retries: int = 5,
              retry_wait: float = 0.5, on_error: str = "raise") -> LocalFiles | StreamedFiles:
    """The files of the dataset at ``where``: a folder, a URL (then ``cache_dir`` is needed), or the
    files object of an opened dataset (passed on as it is). ``on_error="skip"``: a shard of another
    size than the manifest's is refused at its reads, not at the open (``Refused``)."""
    from shardsmith.core.sizes import parse_size
    from shardsmith.core.urls import is_url, safe_url
    from shardsmith.errors import UsageError

    if isinstance(where, LocalFiles | StreamedFiles):
        return where
    if not is_url(str(where)):
        return LocalFiles(where, on_error=on_error)
    if cache_dir is None:
        raise UsageError(f"{safe_url(str(where))}: a dataset at a URL is read through a local cache: give "
                         f"cache_dir= (and cache_limit=, default 20GB)")
    limit = parse_size(cache_limit if cache_limit is not None else "20GB", option="cache_limit")
    return StreamedFiles(RemoteStore(str(where), retries=retries, retry_wait=retry_wait),
                         ShardCache(root=cache_dir, limit=limit), ahead=ahead, on_error=on_error)


@contextlib.contextmanager
def files_at(where: str | os.PathLike[str], *, retries: int = 5,
             retry_wait: float = 0.5) -> Iterator[LocalFiles | StreamedFiles]:
    """The files of the dataset at ``where`` for a command that reads it once (``verify``,
    ``inspect``): a folder as it is; a URL read as the loader reads it, through a temporary cache
    (in ``$TMPDIR``, as large as its free disk allows, removed when done). A URL the loader does not
    read (its scheme, a missing extra, credentials in it) is one line, exit 2."""
    from shardsmith.core.urls import is_url
    from shardsmith.storage import schemes

    if not is_url(str(where)):
        yield LocalFiles(Path(where))
        return
    schemes.filesystem([str(where)], role="loader")  # refused here, as a usage error, before any read
    folder = tempfile.mkdtemp(prefix="shardsmith-cache-")
    try:
        limit = max(1 << 30, shutil.disk_usage(folder).free * 9 // 10)
        yield files_for(where, cache_dir=folder, cache_limit=limit, retries=retries, retry_wait=retry_wait)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
