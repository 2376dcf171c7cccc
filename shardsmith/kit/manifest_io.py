"""Reading and writing a dataset's ``manifest.json``, checked as a whole: the structure every format
shares (``core/manifest.py``), then the format's own fields, by the format the registry names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from shardsmith import registry
from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.core.manifest import MANIFEST, check, resolve_inside, split_of
from shardsmith.errors import DatasetError, UsageError
from shardsmith.kit.format import recorded_names


def validate(manifest: Any, *, where: Path | str) -> None:
    """Every check of a manifest; a format no installed plugin reads is refused here."""
    check(manifest, where=where)
    fmt = registry.format_of(manifest, where=str(where))

    def bad(msg: str) -> DatasetError:
        return DatasetError(f"{where}: {msg}")

    fmt.validate(manifest, bad)
    _check_options(fmt, manifest.get("format_options"), bad)


def _check_options(fmt: Any, given: Any, bad: Any) -> None:
    """The format's options the manifest records, as the format declares them (``kit/options.py``): a
    size in bytes, a flag a bool, a count in its range."""
    if fmt.options is None or not isinstance(given, dict):
        return
    for option in fmt.options.options:
        value = given.get(option.name)
        if option.type == "size" and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad(f"'format_options.{option.name}' must be a size in bytes, not {value!r}")
    try:
        fmt.options.values(given)
    except UsageError as exc:
        raise bad(f"'format_options': {exc}") from None


def save(out_dir: Path, manifest: dict[str, Any]) -> None:
    """Validate and write atomically; this is the last file a conversion writes. It records the
    size and sha256 of every split-wide file (``files``), so ``verify`` covers them as it covers shards."""
    import hashlib

    files = []
    for rel in recorded_names(manifest, registry.format_of(manifest, where=str(Path(out_dir) / MANIFEST))):
        data = resolve_inside(out_dir, rel).read_bytes()
        files.append({"path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    if files:
        manifest["files"] = files
    validate(manifest, where=Path(out_dir) / MANIFEST)
    atomic_write_bytes(Path(out_dir) / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")


def load(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate ``OUT/manifest.json``; a folder without one is not a (finished) dataset."""
    if not Path(out_dir).is_dir():
        raise DatasetError(f"{out_dir}: no such dataset folder")
    path = resolve_inside(out_dir, MANIFEST)  # a link to a manifest elsewhere is refused
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
    return manifest, split_of(manifest, fmt=fmt, split=split, where=out_dir)

