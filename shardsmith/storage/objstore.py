"""An output prefix in object storage (``-o s3://bucket/prefix``): the few operations a run needs.

Built on fsspec, so other schemes can follow: ``Store`` needs only an fsspec filesystem (whole-object
puts, listing, deletes); ``s3store.S3Store`` adds what S3 offers, and ``stores.open_store`` picks the
store of a URL.

What S3 adds, and how every write of a run is fenced, is ``s3store``.

Every call goes through ``storage/retry.py`` (the only layer that retries: s3fs's and botocore's own
retries are off), and the storage client's errors become one line naming the URL, never with
credentials.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from shardsmith.core.urls import safe_url
from shardsmith.errors import DataError, ShardsmithError, UsageError
from shardsmith.storage import retry
from shardsmith.storage.errors import one_line

T = TypeVar("T")
PART_SIZE = 64 << 20  # bytes per part of a multipart upload (S3 allows 5 MiB to 5 GiB, 10 000 parts)
MIN_PART = 5 << 20
MAX_PART = 5 << 30
MAX_PARTS = 10_000
PARTS_IN_FLIGHT = 4  # parts being uploaded at once (each held in memory)
DELETES_IN_FLIGHT = 16  # conditional deletes sent at once (one request per object: ``delete_known``)


class ObjectInfo(NamedTuple):
    size: int
    etag: str  # without quotes


class Changed(ShardsmithError):
    """A conditional write refused: object ``rel`` is not what this run last knew of it (another
    writer put, replaced or removed it), or the run's commit upload was aborted."""

    def __init__(self, message: str, *, rel: str) -> None:
        super().__init__(message)
        self.rel = rel


def file_etag(path: Path, part_size: int) -> str:
    """The ETag S3 gives ``path`` uploaded whole (its MD5) or in parts of ``part_size`` (the MD5 of
    the parts' MD5s, then ``-N``)."""
    digests = []
    with open(path, "rb") as fh:
        while block := fh.read(part_size):
            digests.append(hashlib.md5(block).digest())
    if len(digests) <= 1:
        return (digests[0] if digests else hashlib.md5(b"").digest()).hex()
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def part_size_for(size: int, wanted: int) -> int:
    """``wanted``, grown where a file would need more parts than S3 allows."""
    return max(wanted, -(-size // MAX_PARTS))


class Store:
    """A prefix of any fsspec filesystem: whole-object puts, no part reuse, and conditional puts of
    the run record made as a check, then a put (not atomic: see ``S3Store.create`` and ``replace``)."""

    def __init__(self, *, url: str, fs: Any, policy: retry.Policy, part_size: int = PART_SIZE) -> None:
        self.url = safe_url(url).rstrip("/")
        self.fs = fs
        self.policy = policy
        self.part_size = part_size
        self.root = fs._strip_protocol(url).rstrip("/")
        self.started: set[str] = set()  # the multipart uploads this store began and has not completed

    def show(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def call(self, fn: Callable[[], T], *, rel: str = "", claiming: bool = False) -> T:
        """``fn()``, retried on transient errors; the client's errors as one line."""
        with storage_errors(self.show(rel), claiming=claiming):
            return retry.call(fn, self.policy)

    def list(self) -> dict[str, ObjectInfo]:
        """Every object below the prefix, by its name relative to it."""
        found = self.call(lambda: self.fs.find(self.root, detail=True), claiming=True)
        return {k[len(self.root) + 1:]: ObjectInfo(int(v.get("size") or 0), etag_of(v))
                for k, v in found.items() if v.get("type") == "file" and k.startswith(self.root + "/")}

    def read(self, rel: str) -> bytes | None:
        try:
            return self.call(lambda: self.fs.cat_file(f"{self.root}/{rel}"), rel=rel)
        except UsageError:
            return None  # gone (``storage_errors`` says "no such object")

    def put(self, rel: str, data: bytes) -> None:
        self.call(lambda: self.fs.pipe_file(f"{self.root}/{rel}", data), rel=rel)

    def put_new(self, rel: str, data: bytes) -> bool:
        """Put ``rel`` unless it exists; False if it did."""
        return self.create(rel, data) is not None

    def create(self, rel: str, data: bytes) -> str | None:
        """Put ``rel`` unless it exists; its new ETag, or None if it existed."""
        if self.read(rel) is not None:
            return None
        self.put(rel, data)
        return hashlib.md5(data).hexdigest()

    def read_tagged(self, rel: str) -> tuple[bytes, str] | None:
        """``rel``'s bytes and ETag (None: no such object)."""
        data = self.read(rel)
        return None if data is None else (data, hashlib.md5(data).hexdigest())

    def replace(self, rel: str, data: bytes, etag: str) -> str | None:
        """Put ``rel`` if the object there still has ``etag``; its new ETag, or None if it has
        another (or is gone). Not atomic here: ``S3Store`` puts with ``If-Match``."""
        found = self.read_tagged(rel)
        if found is None or found[1] != etag:
            return None
        self.put(rel, data)
        return hashlib.md5(data).hexdigest()

    def delete(self, rels: list[str]) -> None:
        """Remove objects whatever they hold: only a run that has just taken the prefix (``outremote``)
        and cluster stages, which hold no lease, remove this way; ``delete_known`` is the fenced way."""
        if rels:
            self.call(lambda: self.fs.rm([f"{self.root}/{r}" for r in rels]))

    def head(self, rel: str) -> ObjectInfo | None:
        """What object ``rel`` is now (None: there is none)."""
        try:
            info = self.call(lambda: self.fs.info(f"{self.root}/{rel}"), rel=rel)
        except UsageError:
            return None
        return ObjectInfo(int(info.get("size") or 0), etag_of(info))

    def delete_known(self, known: dict[str, str]) -> list[str]:
        """Remove each object ``rel`` if it still has the ETag ``known[rel]``; returns the names of
        those that changed (one already gone counts as removed). Not atomic here: ``S3Store``
        deletes with ``If-Match``."""
        changed = []
        for rel, etag in sorted(known.items()):
            now = self.head(rel)
            if now is not None and now.etag != etag:
                changed.append(rel)
            elif now is not None:
                self.delete([rel])
        return changed

    def uploads(self) -> dict[str, list[str]]:
        """Unfinished multipart uploads, by name: none without multipart."""
        return {}

    def abort(self, rel: str, upload_ids: list[str]) -> None:
        pass

    def close(self) -> None:
        """No more uploads: stop the threads the store runs (none here)."""

    def open_commit(self, rel: str) -> str | None:
        """The upload that will commit ``rel`` (the manifest), opened before the prefix is claimed;
        None where there is no multipart upload (``commit`` is then a conditional put)."""
        return None

    def commit(self, rel: str, upload_id: str | None, data: bytes) -> None:
        """Put ``rel`` as new (the manifest, last): Changed if it is there with other bytes, or if
        the upload ``open_commit`` gave was aborted (the prefix was taken over)."""
        if self.create(rel, data) is None and self.read(rel) != data:
            raise Changed(f"-o {self.show(rel)}: another run put it", rel=rel)

    def upload(self, rel: str, path: Path, *, known: ObjectInfo | None, resumable: list[str]) -> ObjectInfo | None:
        """``path`` to ``rel``, unless ``known`` (the object there as this run knows it, None: none)
        has its size and checksum (then None); else the object put. Changed when the object is not
        ``known`` any more. Not atomic here (a look, then a put): ``S3Store`` puts conditionally."""
        if known is not None and known.size == path.stat().st_size and known.etag == file_etag(path, self.part_size):
            return None
        if self.head(rel) != known:
            raise Changed(f"-o {self.show(rel)}: changed by another writer since this run knew it", rel=rel)
        self.call(lambda: self.fs.put_file(str(path), f"{self.root}/{rel}"), rel=rel)
        got = self.head(rel)
        if got is None:
            raise Changed(f"-o {self.show(rel)}: removed by another writer as it was put", rel=rel)
        return got


def etag_of(info: dict[str, Any]) -> str:
    """An fsspec listing entry's ETag, without its quotes."""
    return str(info.get("ETag") or info.get("etag") or "").strip('"')


def storage_errors(url: str, *, claiming: bool = False) -> contextlib.AbstractContextManager[None]:
    """The storage client's errors as one line naming ``url``: a missing bucket, a missing object or
    a denied access, and anything while the run claims the prefix, is a usage error (exit 2: the -o
    option names something unusable); later a data error (exit 1). FileExistsError goes through
    (a conditional put that lost: the caller's decision)."""

    def error(kind: str, text: str) -> ShardsmithError:
        if claiming or kind in ("no-bucket", "missing", "denied"):
            return UsageError(f"-o {url}: {text}")
        return DataError(file=url, reason=text)

    return one_line(error, verb="write", words={"no-bucket": "no such bucket (create it first)"},
                    passing=(FileExistsError,))
