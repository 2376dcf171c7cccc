"""A dataset at a URL, as the streaming loader reads it (issue 15, part 3): its manifest, byte ranges
of its files (HTTP Range), and whole files copied into a local file.

Written on fsspec: the filesystem is made as the table of schemes says (``storage/schemes.py``: the
schemes whose record names the loader; s3fs's and botocore's own retries off), so transient errors
are retried by ``storage/retry.py`` only, and a download that breaks off resumes at the byte it
reached. Every file is named by the manifest, relative to the dataset's URL: a name that could
climb out of the prefix is refused. URLs are shown without credentials or signatures
(``core/urls.py``); errors are one line.

Every read is tied to the version of the dataset that was opened (issue 26). ``manifest`` pins
each object's identity right after reading the manifest: one listing of the prefix, taken between
two looks at the manifest's identity that must agree (a rewrite deletes the manifest first and
writes it last, ``engine/output/outremote.py``, so the listing is of the files the manifest names). Then:

- ``s3://`` (its record says ``if_match``): every GET (ranged reads, downloads, block by block)
  sends ``If-Match: <ETag>`` and the answer's ETag is checked too; a replaced object is a 412, one
  DatasetError line "changed since the dataset was opened". Exact: no byte of another version is
  ever returned.
- other schemes (``gs://``, ``root://``, ``http(s)://``): their filesystems send no conditions, so
  the object's identity (etag, generation, or size and modification time) is looked at again
  (``info``) before a file's first ranged read in each process and before every download. A
  change after that look is missed by ranged reads; a download is still checked by its sha256.
  A file the listing did not show (``http(s)``: no listing) is pinned at that first look.

The pins pickle with the store: DataLoader workers, forked or spawned, check the same versions.

What a local open checks is checked here too (issue 42): every shard is of the size its manifest
gives (``expect``, against the listing the dataset was opened on), so a ranged read never serves
bytes of an object that is not the one the manifest describes; a whole download is checked by its
sha256 as well (``storage/cache.py``). An object of the right size whose bytes differ is found by
sha256 when it is downloaded, or by ``shardsmith verify URL``, as a local file changed in place is.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, BinaryIO

import orjson

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.identity import check_size
from shardsmith.core.urls import safe_url
from shardsmith.errors import DatasetError, ShardsmithError
from shardsmith.storage import retry, schemes
from shardsmith.storage.errors import one_line, s3_code

BLOCK = 8 << 20  # bytes per read of a whole-file download
OPEN_TRIES = 3  # listings taken at most while the dataset changes under them, before giving up
CHANGED = "changed since the dataset was opened (rewritten, e.g. with --overwrite?); open the dataset again"


class RemoteStore:
    """The files of the dataset at ``url`` (a prefix holding ``manifest.json``). Pickles as its URL,
    retry policy and pins: each process makes its own filesystem (s3fs's event loop does not survive
    a fork) and checks the versions the dataset was opened on."""

    def __init__(self, url: str, *, retries: int = 5, retry_wait: float = 0.5) -> None:
        self.url = url.rstrip("/")
        self.where = safe_url(self.url)
        self.policy = retry.Policy(retries=retries, wait=retry_wait)
        self.scheme = schemes.record(self.url)  # what the table of schemes says of it
        self.pins: dict[str, str] = {}  # file -> its identity when the dataset was opened (s3: the ETag)
        self.sizes: dict[str, int] = {}  # file -> its size in the same listing
        self.expected: dict[str, int] = {}  # file -> its size in the manifest (``expect``)
        self._fs: Any = None
        self._pid = -1
        self._seen: set[str] = set()  # other schemes: files whose identity this process has looked at

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_pid": -1, "_seen": set()}

    @property
    def fs(self) -> Any:
        if self._fs is None or self._pid != os.getpid():
            try:
                self._fs = schemes.filesystem([self.url], role="loader")
            except ShardsmithError as exc:  # an unknown scheme, a missing extra: one line as it is
                raise DatasetError(str(exc)) from None
            self._pid = os.getpid()
            self._seen = set()
        return self._fs

    def name(self, rel: str) -> str:
        """The URL of the dataset file ``rel`` as shown."""
        return f"{self.where}/{rel}"

    def key(self, rel: str) -> str:
        """``rel`` as the filesystem opens it, below the dataset's prefix and nowhere else."""
        if not manifest_mod.safe_relative(rel) or any(p in ("", ".", "..") for p in rel.split("/")):
            raise DatasetError(f"{self.where}: refusing path {rel!r}: not inside the dataset's prefix")
        return f"{self.fs._strip_protocol(self.url)}/{rel}"

    def manifest(self) -> dict[str, Any]:
        """The dataset's manifest as fetched, unchecked (its reader checks it whole, as a local one:
        ``kit/manifest_io.validate``); every file of the prefix pinned to the version listed with it."""
        where = self.name(manifest_mod.MANIFEST)
        for _ in range(OPEN_TRIES):
            with self.errors(where, missing="no manifest.json: not a shardsmith dataset, or its conversion did "
                                            "not finish"):
                before, raw = retry.call(self._manifest_bytes, self.policy)
                found = retry.call(self._listing, self.policy)
                listed = {rel: _tag(info) for rel, info in found.items()}
                after = retry.call(lambda: self._identity(manifest_mod.MANIFEST), self.policy)
            if before == after and listed.get(manifest_mod.MANIFEST, before) == before:
                break
        else:
            raise DatasetError(f"{where}: the dataset changed while it was being opened ({OPEN_TRIES} tries); "
                               f"open it again when its writer is done")
        self.pins = {**listed, manifest_mod.MANIFEST: before}
        self.sizes = {rel: int(info["size"]) for rel, info in found.items() if info.get("size") is not None}
        self._seen = set()
        try:
            manifest = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc})") from None
        return manifest

    def read(self, rel: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of file ``rel``: one ranged GET (retried), of the version opened."""
        if end <= start:
            return b""
        with self.errors(self.name(rel)):
            data = retry.call(lambda: self._get(rel, [(start, end)])[0], self.policy)
        if len(data) != end - start:
            raise DatasetError(f"{self.name(rel)}: {len(data)} bytes at {start}, expected {end - start} (the object "
                               f"is shorter than the manifest says)")
        return data

    def read_ranges(self, rel: str, starts: list[int], ends: list[int]) -> list[bytes]:
        """Several ranges of one file, fetched concurrently, each checked."""
        if len(starts) <= 1:
            return [self.read(rel, a, b) for a, b in zip(starts, ends)]
        with self.errors(self.name(rel)):
            got = retry.call(lambda: self._get(rel, list(zip(starts, ends))), self.policy)
        for data, a, b in zip(got, starts, ends):
            if len(data) != b - a:
                raise DatasetError(f"{self.name(rel)}: {len(data)} bytes at {a}, expected {b - a}")
        return list(got)

    def expect(self, sizes: dict[str, int]) -> None:
        """The files' sizes as the manifest gives them, checked as a local open checks a folder's
        (``identity.check_size``): against the listing the dataset was opened on, now; a scheme
        that does not list (``http(s)``), at each file's first look, before any byte is read."""
        self.expected.update(sizes)
        if not self.scheme.whole_url:
            for rel, want in sizes.items():
                check_size(self.name(rel), self.sizes.get(rel), want)

    def size(self, rel: str) -> int | None:
        """The size of file ``rel`` in the listing taken when the dataset was opened (a scheme that does
        not list: its size now); None when there is no such object (``verify``: "missing")."""
        if not self.scheme.whole_url:
            return self.sizes.get(rel)
        with self.errors(self.name(rel)):
            try:
                return int(retry.call(lambda: self.fs.info(self.key(rel)), self.policy)["size"])
            except FileNotFoundError:
                return None

    def download(self, rel: str, dst: BinaryIO, size: int) -> None:
        """File ``rel`` into ``dst`` from its current position on, block by block; a read that breaks
        off is retried from the byte it reached (``retry.call``'s ``progressed``)."""
        reached = [dst.tell()]

        def progressed() -> bool:
            further, reached[0] = dst.tell() > reached[0], dst.tell()
            return further

        def copy() -> None:
            if self.scheme.if_match:  # each block a GET conditional on the pinned ETag
                while dst.tell() < size and (block := self._get(rel, [(dst.tell(), min(size, dst.tell() + BLOCK))],
                                                                 past_end=True)[0]):
                    dst.write(block)
                return
            self._check(rel, again=True)
            with self.fs.open(self.key(rel), "rb", block_size=BLOCK) as src:
                if dst.tell():
                    src.seek(dst.tell())
                while dst.tell() < size and (block := src.read(min(BLOCK, size - dst.tell()))):
                    dst.write(block)

        with self.errors(self.name(rel)):
            retry.call(copy, self.policy, progressed=progressed)

    def errors(self, where: str, *, missing: str = "no such object") -> contextlib.AbstractContextManager[None]:
        """The storage client's errors as one DatasetError line naming ``where`` (never a credential)."""
        return one_line(lambda kind, text: DatasetError(f"{where}: {text}"), verb="read", words={"missing": missing})

    # -- pins ------------------------------------------------------------------------------------

    def _identity(self, rel: str) -> str:
        """The identity of file ``rel`` now (a HEAD, or the scheme's ``info``), never a cached listing's."""
        return _tag(self._info(rel))

    def _info(self, rel: str) -> dict[str, Any]:
        self.fs.invalidate_cache()
        return self.fs.info(self.key(rel))

    def _manifest_bytes(self) -> tuple[str, bytes]:
        """(identity, bytes) of the manifest: on S3 one GET and its ETag; elsewhere ``info``, then the bytes."""
        if self.scheme.if_match:
            return sync(self.fs.loop, self._s3_gets, manifest_mod.MANIFEST, [(None, None)], None)[0]
        tag = self._identity(manifest_mod.MANIFEST)
        return tag, self.fs.cat_file(self.key(manifest_mod.MANIFEST), start=None, end=None)  # (XRootD: both asked)

    def _listing(self) -> dict[str, dict[str, Any]]:
        """Every file below the prefix and what the listing says of it (none for schemes that do
        not list: their files are pinned when first looked at)."""
        if self.scheme.whole_url:
            return {}
        name = self.scheme.name
        prefix = schemes.key(name, self.fs._strip_protocol(self.url)).rstrip("/") + "/"
        self.fs.invalidate_cache()
        found = {schemes.key(name, k): v for k, v in self.fs.find(prefix, detail=True, **self.scheme.walk).items()}
        return {path[len(prefix):]: info for path, info in found.items() if path.startswith(prefix)}

    def _check(self, rel: str, *, again: bool = False) -> None:
        """Other schemes: the file is still the version pinned (its first look pins a file the listing
        did not show); looked at once per process, or ``again``."""
        if rel in self._seen and not again:
            return
        info = self._info(rel)
        now = _tag(info)
        if self.pins.setdefault(rel, now) != now:
            raise DatasetError(f"{self.name(rel)}: {CHANGED}")
        if rel in self.expected and info.get("size") is not None:  # (a server may not say: reads check lengths)
            check_size(self.name(rel), int(info["size"]), self.expected[rel])
        self._seen.add(rel)

    def _get(self, rel: str, ranges: list[tuple[int, int]], *, past_end: bool = False) -> list[bytes]:
        """Byte ranges of file ``rel``, of the pinned version (``past_end``: a range starting past the
        object's end is empty, not an error)."""
        if not self.scheme.if_match:
            self._check(rel)
            key = self.key(rel)
            if len(ranges) == 1:
                return [self.fs.cat_file(key, start=ranges[0][0], end=ranges[0][1])]
            return list(self.fs.cat_ranges([key] * len(ranges), [a for a, _ in ranges], [b for _, b in ranges],
                                           on_error="raise"))
        etag = self.pins.get(rel)
        if etag is None and self.pins:
            raise DatasetError(f"{self.name(rel)}: not among the objects listed when the dataset was opened; "
                               f"open the dataset again")
        got = sync(self.fs.loop, self._s3_gets, rel, ranges, etag, past_end)
        return [data for _, data in got]

    async def _s3_gets(self, rel: str, ranges: list[tuple[int | None, int | None]], etag: str | None,
                       past_end: bool = False) -> list[tuple[str, bytes]]:
        """(ETag, bytes) of each range (None: the whole object), concurrently: GETs with ``If-Match``."""
        bucket, key, _ = self.fs.split_path(self.key(rel))

        async def one(a: int | None, b: int | None) -> tuple[str, bytes]:
            kw = {"Range": f"bytes={a}-{b - 1}"} if a is not None and b is not None else {}
            if etag is not None:
                kw["IfMatch"] = etag
            try:
                resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
            except OSError as exc:
                code = s3_code(exc)
                if code in ("PreconditionFailed", "412"):
                    raise DatasetError(f"{self.name(rel)}: {CHANGED}") from None
                if past_end and code in ("InvalidRange", "416"):
                    return etag or "", b""
                raise
            try:
                if etag is not None and resp.get("ETag") != etag:  # a server that ignores If-Match
                    raise DatasetError(f"{self.name(rel)}: {CHANGED}")
                return resp.get("ETag", ""), await resp["Body"].read()
            finally:
                resp["Body"].close()

        import asyncio  # here: its import (with ssl's, ~15 ms) is for streamed reads only

        return list(await asyncio.gather(*(one(a, b) for a, b in ranges)))


def sync(loop: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` run on the filesystem's event loop (fsspec's own bridge; fsspec is an extra)."""
    from fsspec.asyn import sync as run

    return run(loop, fn, *args)


def _tag(info: dict[str, Any]) -> str:
    """An object's identity from its ``info``/listing entry: its ETag (s3, http), etag or generation
    (gcs), version id; else its size and modification time."""
    for k in ("ETag", "etag", "generation", "VersionId"):
        if info.get(k):
            return str(info[k])
    when = next((info[k] for k in ("mtime", "LastModified", "updated", "last_modified") if info.get(k)), "")
    return f"{info.get('size')} bytes, modified {when}"
