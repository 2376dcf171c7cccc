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
import posixpath
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import orjson

from shardsmith import registry
from shardsmith.core import manifest as manifest_mod
from shardsmith.core.sizes import format_size
from shardsmith.core.words import plural
from shardsmith.errors import DatasetError, ShardsmithError
from shardsmith.kit.dataset_files import LocalFiles, StreamedFiles, files_at
from shardsmith.kit.writer import manifest_files


def _split_files(read: Callable[[str], bytes], m: dict[str, Any], *, failed: set[str]) -> list[str]:
    """Split-wide files: the tokenizer against its sha256 when the manifest's ``files`` does not list it
    (manifests written before ``files`` was recorded, or a list cut short), and each wids index against
    the shards it lists, whether listed or not (its sha256 agreeing with a manifest made to agree with it
    says nothing of its shard list). ``failed``: files whose size or sha256 was found wrong already."""
    listed = {e["path"] for e in m.get("files") or []}
    problems = []
    tok = m.get("tokenizer")
    if isinstance(tok, dict) and tok["path"] not in listed:
        try:
            data = read(tok["path"])
            if hashlib.sha256(data).hexdigest() != tok["sha256"]:
                problems.append(f"{tok['path']}: sha256 differs from the manifest's tokenizer.sha256")
        except OSError as exc:
            problems.append(f"{tok['path']}: cannot read ({exc.strerror or exc})")
        except DatasetError as exc:
            problems.append(str(exc))
    for split in m["splits"].values():
        wids = split.get("wids")
        if isinstance(wids, str) and wids not in failed:
            problems += _check_wids(read, wids, split["shards"])
    return problems


def _check_wids(read: Callable[[str], bytes], rel: str, shards: list[dict[str, Any]]) -> list[str]:
    try:
        index = orjson.loads(read(rel))
        here = posixpath.dirname(rel)  # urls are relative to the index (``__index__/``: ``../train-000000.tar``)
        listed = [(posixpath.normpath(posixpath.join(here, e["url"])), e["nsamples"], e["filesize"])
                  for e in index["shardlist"]]
    except DatasetError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"{rel}: cannot read ({exc.strerror or exc})"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return [f"{rel}: not a wids shard index"]
    if index.get("__kind__") != "wids-shard-index-v1" or type(index.get("wids_version")) is not int \
            or index.get("wids_version") != 1:
        return [f"{rel}: not a wids shard index (its __kind__ and wids_version are not wids' version 1)"]
    want = [(s["path"], s["samples"], s["bytes"]) for s in shards]
    # of the same types too: a count of True or 1.0 is not the manifest's 1
    if [tuple(map(type, e)) for e in listed] != [(str, int, int)] * len(listed) or listed != want:
        return [f"{rel}: its shard list differs from the manifest's shards"]
    return []


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
    out = files if files.streamed else files.root  # what the format's checks are given
    check = (lambda e: _check_object(files, e)) if files.streamed else (lambda e: _check_file(files.root, e))
    entries = manifest_files(m)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        found = list(pool.map(check, entries))
    problems = [p for p in found if p]
    problems += _split_files(_reader(files), m, failed={e["path"] for e, p in zip(entries, found) if p})
    if not problems:
        try:
            fmt = registry.format_of(m, where=files.where)
        except DatasetError as exc:
            problems.append(str(exc))
        else:
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
