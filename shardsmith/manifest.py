"""``manifest.json``: the commit point of a conversion, written last from what was actually written.

Version 1 fields are listed in DESIGN.md. ``load`` validates structure and paths before anything
else reads a dataset, so a loader never follows a manifest outside its folder.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from shardsmith import __version__
from shardsmith.errors import DatasetError
from shardsmith.fsutil import atomic_write_bytes

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
FORMATS = ("tokens", "webdataset", "hdf5")
_REQUIRED = ("shardsmith", "format", "created", "tool_version", "command", "seed", "shuffle", "source",
             "schema", "splits")


def new_manifest(*, fmt: str, seed: int, shuffle: bool, source: dict[str, Any], schema: dict[str, Any],
                 splits: dict[str, Any], **extras: Any) -> dict[str, Any]:
    """A manifest with the common fields filled in; extras are format-specific (``tokenizer``, …)."""
    return {
        "shardsmith": FORMAT_VERSION,
        "format": fmt,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__,
        "command": list(sys.argv),
        "seed": seed,
        "shuffle": shuffle,
        "source": source,
        "schema": schema,
        "splits": splits,
        **extras,
    }


def save(out_dir: Path, manifest: dict[str, Any]) -> None:
    """Validate and write atomically; this is the last file a conversion writes."""
    validate(manifest, where=Path(out_dir) / MANIFEST)
    atomic_write_bytes(Path(out_dir) / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")


def load(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate ``OUT/manifest.json``; a folder without one is not a (finished) dataset."""
    path = Path(out_dir) / MANIFEST
    if not Path(out_dir).is_dir():
        raise DatasetError(f"{out_dir}: no such dataset folder")
    if not path.is_file():
        raise DatasetError(f"{out_dir}: no {MANIFEST}: not a shardsmith dataset, or its conversion did not finish")
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None
    validate(manifest, where=path)
    return manifest


def load_split(out_dir: str | os.PathLike[str], *, fmt: str, split: str) -> tuple[dict[str, Any], list[dict]]:
    """(manifest, shard entries of ``split``) of a dataset that must be of format ``fmt``."""
    manifest = load(out_dir)
    if manifest["format"] != fmt:
        raise DatasetError(f"{out_dir}: a {manifest['format']} dataset, not {fmt}")
    splits = manifest["splits"]
    if split not in splits:
        raise DatasetError(f"{out_dir}: no split {split!r} (splits: {', '.join(splits)})")
    return manifest, splits[split]["shards"]


def validate(manifest: Any, *, where: Path) -> None:
    """Structure and path checks; raises DatasetError naming what is wrong."""
    def bad(msg: str) -> DatasetError:
        return DatasetError(f"{where}: {msg}")

    if not isinstance(manifest, dict):
        raise bad("not a JSON object")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise bad(f"missing fields: {', '.join(missing)}")
    if manifest["shardsmith"] != FORMAT_VERSION:
        raise bad(f"format version {manifest['shardsmith']!r}; this shardsmith reads version {FORMAT_VERSION}")
    if manifest["format"] not in FORMATS:
        raise bad(f"unknown format {manifest['format']!r}")
    splits = manifest["splits"]
    if not isinstance(splits, dict):
        raise bad("'splits' is not an object")
    for name, split in splits.items():
        if not isinstance(split, dict) or not isinstance(split.get("shards"), list):
            raise bad(f"split {name!r} has no shard list")
        if not _is_count(split.get("samples")):
            raise bad(f"split {name!r}: 'samples' is not a count")
        for shard in split["shards"]:
            _check_file_entry(shard, bad)
            if not _is_count(shard.get("samples")):
                raise bad(f"shard {shard.get('path')!r}: 'samples' is not a count")
            if "index" in shard:
                _check_file_entry(shard["index"], bad)
        if sum(s["samples"] for s in split["shards"]) != split["samples"]:
            raise bad(f"split {name!r}: shard sample counts do not add up to {split['samples']}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_file_entry(entry: Any, bad: Any) -> None:
    if not isinstance(entry, dict):
        raise bad("a shard entry is not an object")
    path = entry.get("path")
    if not isinstance(path, str) or not safe_relative(path):
        raise bad(f"shard path {path!r} is not a plain relative path inside the dataset folder")
    if not _is_count(entry.get("bytes")):
        raise bad(f"shard {path!r}: 'bytes' is not a count")
    sha = entry.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise bad(f"shard {path!r}: 'sha256' is not a hex digest")


def safe_relative(path: str) -> bool:
    """A POSIX relative path with no ``..``, no absolute root and no backslashes or NULs."""
    if not path or "\\" in path or "\x00" in path:
        return False
    p = PurePosixPath(path)
    return not p.is_absolute() and ".." not in p.parts and p.parts[0] not in ("", ".")


def resolve_inside(out_dir: str | os.PathLike[str], rel: str) -> Path:
    """The real path of a dataset file, refusing anything (symlinks included) that leads outside."""
    if not safe_relative(rel):
        raise DatasetError(f"{out_dir}: refusing path {rel!r}: not inside the dataset folder")
    root = Path(out_dir).resolve()
    target = (root / rel).resolve()
    if root != target and root not in target.parents:
        raise DatasetError(f"{out_dir}: refusing path {rel!r}: it leads outside the dataset folder")
    return target
