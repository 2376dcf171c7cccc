"""``shardsmith verify``: every file against the manifest (size, sha256); ``--deep`` opens every sample.

A dataset folder, or a dataset at a URL of any scheme the loader reads (``storage/schemes.py``),
read as the loader reads it (``kit/dataset_files.py``): each object of the version opened (its ETag
pinned), hashed as it streams in; the format's checks get the dataset's files instead of a folder,
and ``--deep`` reads the shards whole through a temporary cache. The same one-line problems.

Hashing runs on threads (hashlib and file reads release the GIL), so verify goes at disk speed.
Problems are collected, not raised: the user gets the whole list and a non-zero exit.
"""

from __future__ import annotations

import errno
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from shardsmith import registry
from shardsmith.core import manifest as manifest_mod
from shardsmith.core.sizes import format_size
from shardsmith.core.words import plural
from shardsmith.errors import DatasetError, ShardsmithError
from shardsmith.kit.dataset_files import LocalFiles, StreamedFiles, files_at
from shardsmith.kit.format import manifest_files


def _check_file(out: Path, entry: dict[str, Any]) -> str | None:
    """A local file against its entry: None, or the problem in a line."""
    try:
        path = manifest_mod.resolve_inside(out, entry["path"])
    except DatasetError as exc:
        return str(exc)
    if not path.is_file():
        return f"{entry['path']}: missing"
    size = path.stat().st_size
    if size != entry["bytes"]:
        return f"{entry['path']}: {size} bytes, the manifest says {entry['bytes']}"
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            sha.update(block)
    if sha.hexdigest() != entry["sha256"]:
        return f"{entry['path']}: sha256 {sha.hexdigest()[:16]}… differs from the manifest's {entry['sha256'][:16]}…"
    return None


def _check_object(files: StreamedFiles, entry: dict[str, Any]) -> str | None:
    """An object of a dataset at a URL against its entry, in the words of ``_check_file``: its size in
    the listing taken when the dataset was opened, then its bytes of that version, hashed as they come."""
    rel, store = entry["path"], files.store
    try:
        store.key(rel)  # refused unless below the prefix
        size = store.size(rel)
        if size is None:
            return f"{rel}: missing"
        if size != entry["bytes"]:
            return f"{rel}: {size} bytes, the manifest says {entry['bytes']}"
        digest = _Digest()
        store.download(rel, digest, size)  # type: ignore[arg-type]
    except DatasetError as exc:
        return str(exc)
    if digest.size != size:
        return f"{rel}: {digest.size} bytes, the manifest says {entry['bytes']}"
    if digest.sha.hexdigest() != entry["sha256"]:
        return f"{rel}: sha256 {digest.sha.hexdigest()[:16]}… differs from the manifest's {entry['sha256'][:16]}…"
    return None


class _Digest:
    """Where a download goes when only its sha256 and size are wanted."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


def _reader(files: LocalFiles | StreamedFiles) -> Callable[[str], bytes]:
    """A whole file of the dataset by its name in the manifest (OSError or DatasetError when it cannot be)."""
    if not files.streamed:
        return lambda rel: manifest_mod.resolve_inside(files.root, rel).read_bytes()
    store = files.store  # type: ignore[union-attr]

    def read(rel: str) -> bytes:
        store.key(rel)
        size = store.size(rel)
        if size is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        return store.read(rel, 0, size)

    return read


def run(where: str | Path, *, deep: bool, workers: int) -> bool:
    """Verify the dataset at ``where`` (a folder or a URL); False when a problem was found."""
    with files_at(where) as files:
        return _verify(files, deep=deep, workers=workers)


def _verify(files: LocalFiles | StreamedFiles, *, deep: bool, workers: int) -> bool:
    t0 = time.perf_counter()
    try:
        m = files.load_manifest()
    except ShardsmithError as exc:
        click.echo(f"FAIL {exc}")
        return False
    fmt = registry.format_of(m, where=files.where)  # (loading the manifest found it)
    out = files if files.streamed else files.root  # what the format's checks are given
    check = (lambda e: _check_object(files, e)) if files.streamed else (lambda e: _check_file(files.root, e))
    entries = manifest_files(m, fmt)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        found = list(pool.map(check, entries))
    problems = [p for p in found if p]
    problems += fmt.verify_files(_reader(files), m, failed={e["path"] for e, p in zip(entries, found) if p})
    if not problems:
        for split in m["splits"]:
            problems += fmt.verify_layout(out, m, split)
        for split in m["splits"] if deep and not problems else ():
            problems += fmt.verify_deep(out, m, split)
    elapsed = time.perf_counter() - t0
    size = sum(e["bytes"] for e in entries)
    for p in problems:
        click.echo(f"FAIL {p}")
    samples = sum(s["samples"] for s in m["splits"].values())
    verdict = "OK" if not problems else plural(len(problems), 'problem')
    click.echo(f"{files.where}: {verdict}: {plural(len(entries), 'file')}, {plural(samples, 'sample')}, "
               f"{format_size(size)} checked"
               f"{' (deep)' if deep else ''} in {elapsed:.2f} s ({size / max(elapsed, 1e-9) / 1e6:,.0f} MB/s)")
    return not problems
