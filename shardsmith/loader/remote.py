"""A dataset at a URL, as the streaming loader reads it (issue 15, part 3): its manifest, byte ranges
of its files (HTTP Range), and whole files copied into a local file.

Written on fsspec (``engine/remote.py`` makes the filesystem: s3fs's and botocore's own retries
off), so every scheme fsspec reads can follow; transient errors are retried by ``engine/retry.py``
only, and a download that breaks off resumes at the byte it reached. Every file is named by the
manifest, relative to the dataset's URL: a name that could climb out of the prefix is refused.
URLs are shown without credentials or signatures (``core/urls.py``); errors are one line.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, BinaryIO

import orjson

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.urls import safe_url
from shardsmith.engine import retry
from shardsmith.engine.storage_errors import one_line
from shardsmith.errors import DatasetError, ShardsmithError

BLOCK = 8 << 20  # bytes per read of a whole-file download


class RemoteStore:
    """The files of the dataset at ``url`` (a prefix holding ``manifest.json``). Pickles as its URL and
    retry policy: each process makes its own filesystem (s3fs's event loop does not survive a fork)."""

    def __init__(self, url: str, *, retries: int = 5, retry_wait: float = 0.5) -> None:
        self.url = url.rstrip("/")
        self.where = safe_url(self.url)
        self.policy = retry.Policy(retries=retries, wait=retry_wait)
        self._fs: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_pid": -1}

    @property
    def fs(self) -> Any:
        if self._fs is None or self._pid != os.getpid():
            from shardsmith.engine.backends import filesystem  # the commands' one table of schemes and extras

            try:
                self._fs = filesystem([self.url])
            except ShardsmithError as exc:  # an unknown scheme, a missing extra: one line as it is
                raise DatasetError(str(exc)) from None
            self._pid = os.getpid()
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
        """The dataset's manifest, fetched and validated as ``core.manifest.load`` validates a local one."""
        where = self.name(manifest_mod.MANIFEST)
        with self.errors(where, missing="no manifest.json: not a shardsmith dataset, or its conversion did "
                                        "not finish"):
            raw = retry.call(lambda: self.fs.cat_file(self.key(manifest_mod.MANIFEST)), self.policy)
        try:
            manifest = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc})") from None
        manifest_mod.validate(manifest, where=where)  # type: ignore[arg-type]  (a name to show)
        return manifest

    def read(self, rel: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of file ``rel``: one ranged GET (retried)."""
        if end <= start:
            return b""
        with self.errors(self.name(rel)):
            data = retry.call(lambda: self.fs.cat_file(self.key(rel), start=start, end=end), self.policy)
        if len(data) != end - start:
            raise DatasetError(f"{self.name(rel)}: {len(data)} bytes at {start}, expected {end - start} (the object "
                               f"is shorter than the manifest says)")
        return data

    def read_ranges(self, rel: str, starts: list[int], ends: list[int]) -> list[bytes]:
        """Several ranges of one file, fetched concurrently (fsspec's ``cat_ranges``), each checked."""
        if len(starts) <= 1:
            return [self.read(rel, a, b) for a, b in zip(starts, ends)]
        key = self.key(rel)
        with self.errors(self.name(rel)):
            got = retry.call(lambda: self.fs.cat_ranges([key] * len(starts), starts, ends, on_error="raise"),
                             self.policy)
        for data, a, b in zip(got, starts, ends):
            if len(data) != b - a:
                raise DatasetError(f"{self.name(rel)}: {len(data)} bytes at {a}, expected {b - a}")
        return list(got)

    def download(self, rel: str, dst: BinaryIO, size: int) -> None:
        """File ``rel`` into ``dst`` from its current position on, block by block; a read that breaks
        off is retried from the byte it reached (``retry.call``'s ``progressed``)."""
        reached = [dst.tell()]

        def progressed() -> bool:
            further, reached[0] = dst.tell() > reached[0], dst.tell()
            return further

        def copy() -> None:
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
