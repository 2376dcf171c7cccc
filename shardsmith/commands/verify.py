"""``shardsmith verify``: every file against the manifest (size, sha256); ``--deep`` opens every sample.

Hashing runs on threads (hashlib and file reads release the GIL), so verify goes at disk speed.
Problems are collected, not raised: the user gets the whole list and a non-zero exit.
"""

from __future__ import annotations

import hashlib
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import orjson

from shardsmith import registry
from shardsmith.core import manifest as manifest_mod
from shardsmith.core.sizes import format_size
from shardsmith.errors import DatasetError, ShardsmithError
from shardsmith.kit import manifest_io


def _files(m: dict[str, Any]) -> list[dict[str, Any]]:
    """Every file entry the manifest lists: shards, their indexes and boundaries, nanoGPT files."""
    entries = []
    for split in m["splits"].values():
        for shard in split["shards"]:
            entries.append(shard)
            entries += [shard[key] for key in ("index", "boundaries") if key in shard]
    entries += [e for e in (m.get("nanogpt") or {}).values() if isinstance(e, dict)]
    entries += m.get("files") or []
    return entries


def _unlisted_files(out: Path, m: dict[str, Any]) -> list[str]:
    """Split-wide files the manifest names but its ``files`` does not list (manifests written before
    ``files`` was recorded, or a list cut short): the tokenizer against its sha256, each wids index
    against the shards it lists."""
    listed = {e["path"] for e in m.get("files") or []}
    problems = []
    tok = m.get("tokenizer")
    if isinstance(tok, dict) and tok["path"] not in listed:
        try:
            data = manifest_mod.resolve_inside(out, tok["path"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != tok["sha256"]:
                problems.append(f"{tok['path']}: sha256 differs from the manifest's tokenizer.sha256")
        except OSError as exc:
            problems.append(f"{tok['path']}: cannot read ({exc.strerror or exc})")
        except DatasetError as exc:
            problems.append(str(exc))
    for split in m["splits"].values():
        wids = split.get("wids")
        if isinstance(wids, str) and wids not in listed:
            problems += _check_wids(out, wids, split["shards"])
    return problems


def _check_wids(out: Path, rel: str, shards: list[dict[str, Any]]) -> list[str]:
    try:
        index = orjson.loads(manifest_mod.resolve_inside(out, rel).read_bytes())
        here = posixpath.dirname(rel)  # urls are relative to the index (``__index__/``: ``../train-000000.tar``)
        listed = [(posixpath.normpath(posixpath.join(here, e["url"])), e["nsamples"], e["filesize"])
                  for e in index["shardlist"]]
    except DatasetError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"{rel}: cannot read ({exc.strerror or exc})"]
    except (ValueError, KeyError, TypeError):
        return [f"{rel}: not a wids shard index"]
    want = [(s["path"], s["samples"], s["bytes"]) for s in shards]
    if listed != want:
        return [f"{rel}: its shard list differs from the manifest's shards"]
    return []


def _check_file(out: Path, entry: dict[str, Any]) -> str | None:
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


def run(out: Path, *, deep: bool, workers: int) -> bool:
    t0 = time.perf_counter()
    try:
        m = manifest_io.load(out)
    except ShardsmithError as exc:
        click.echo(f"FAIL {exc}")
        return False
    entries = _files(m)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        problems = [p for p in pool.map(lambda e: _check_file(out, e), entries) if p]
    problems += _unlisted_files(out, m)
    if not problems:
        try:
            fmt = registry.format_of(m, where=str(out))
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
    verdict = "OK" if not problems else f"{len(problems)} problem{'s' * (len(problems) != 1)}"
    click.echo(f"{out}: {verdict}: {len(entries)} files, {samples:,} samples, {format_size(size)} checked"
               f"{' (deep)' if deep else ''} in {elapsed:.2f} s ({size / max(elapsed, 1e-9) / 1e6:,.0f} MB/s)")
    return not problems

