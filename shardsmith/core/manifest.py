"""``manifest.json``: the commit point of a conversion, written last from what was actually written.

Version 1 fields and the trust rules are in docs/design.md, "The manifest". ``load`` validates
structure and paths before anything else reads a dataset, so a loader never follows a manifest
outside its folder.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path, PurePosixPath
from typing import Any

from shardsmith.core.invocation import command_line
from shardsmith.core.version import __version__
from shardsmith.errors import DatasetError

MANIFEST = "manifest.json"
RUN_FILE = ".shardsmith-run.json"  # the record of the run filling an output folder (engine/output/resume.py)
FORMAT_VERSION = 1
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
        "command": command_line(),
        "seed": seed,
        "shuffle": shuffle,
        "source": source,
        "schema": schema,
        "splits": splits,
        **extras,
    }


def companion_names(manifest: dict[str, Any]) -> list[str]:
    """The ``companions`` a manifest names: split-wide files other tools read beside the shards,
    which the manifest's ``files`` records (``kit/manifest_io.py``)."""
    return [c for c in manifest.get("companions") or () if isinstance(c, str)]


def shard_files(shard: dict[str, Any]) -> list[dict[str, Any]]:
    """A shard's record and the records of the files that go with it (its *companions*), in that
    order. A writer declares a companion by giving the shard's record a field that is a file entry
    (an object with a ``path``, and its ``bytes`` and ``sha256``): a token shard's ``index``, a tar
    shard's offset index, a file of a shard written as a folder. ``check`` holds each to the rules
    of a shard's own entry, so every reader may trust its path."""
    return [shard, *(v for v in shard.values() if isinstance(v, dict) and "path" in v)]


def split_of(manifest: dict[str, Any], *, fmt: str, split: str, where: Any) -> list[dict]:
    """The shard entries of ``split`` of a loaded manifest that must be of format ``fmt``."""
    if manifest["format"] != fmt:
        raise DatasetError(f"{where}: a {manifest['format']} dataset, not {fmt}")
    splits = manifest["splits"]
    if split not in splits:
        raise DatasetError(f"{where}: no split {split!r} (splits: {', '.join(splits)})")
    return splits[split]["shards"]


def check(manifest: Any, *, where: Path | str) -> None:
    """Structure and path checks that hold for every format (``kit/manifest_io.py`` adds the
    format's own); raises DatasetError naming what is wrong."""
    def bad(msg: str) -> DatasetError:
        return DatasetError(f"{where}: {msg}")

    if not isinstance(manifest, dict):
        raise bad("not a JSON object")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise bad(f"missing fields: {', '.join(missing)}")
    if not isinstance(manifest["format"], str) or type(manifest["shardsmith"]) is not int:
        raise bad("'shardsmith' and 'format' must be a version number and a format name")
    if manifest["shardsmith"] != FORMAT_VERSION:
        raise bad(f"format version {manifest['shardsmith']!r}; this shardsmith reads version {FORMAT_VERSION}")
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
            for companion in shard_files(shard)[1:]:
                _check_file_entry(companion, bad)
        if sum(s["samples"] for s in split["shards"]) != split["samples"]:
            raise bad(f"split {name!r}: shard sample counts do not add up to {split['samples']}")
    _check_common(manifest, bad)


# -- what each format's readers read: every field typed, so no reader meets a KeyError ------------

MAX_COUNT = 1 << 62


def need(m: dict[str, Any], key: str, kinds: Any, bad: Any, *, where: str = "", optional: bool = False,
          nullable: bool = False) -> Any:
    """``m[key]``, which must be an instance of ``kinds`` (bools are not ints); ``optional``: it may
    be absent; ``nullable``: it may be null."""
    name = f"{where}{key}"
    if key not in m:
        if optional:
            return None
        raise bad(f"{name!r} is missing")
    value = m[key]
    if value is None and nullable:
        return None
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in _tuple(kinds))
    if not ok:
        names = "/".join(k.__name__ for k in _tuple(kinds))
        raise bad(f"{name!r} must be {names}, not {type(value).__name__}")
    return value


def _tuple(kinds: Any) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def count(m: dict[str, Any], key: str, bad: Any, *, where: str = "", optional: bool = False,
           nullable: bool = False, low: int = 0) -> int | None:
    value = need(m, key, int, bad, where=where, optional=optional, nullable=nullable)
    if value is not None and not low <= value <= MAX_COUNT:
        raise bad(f"'{where}{key}' is {value}, out of range [{low}, 2**62]")
    return value


def file_entry(entry: Any, bad: Any, what: str) -> None:
    if not isinstance(entry, dict):
        raise bad(f"{what!r} must be an object")
    _check_file_entry(entry, bad)


def _check_common(m: dict[str, Any], bad: Any) -> None:
    for key in ("created", "tool_version"):
        need(m, key, str, bad)
    need(m, "command", list, bad)
    seed = need(m, "seed", int, bad)
    if not 0 <= seed < 1 << 64:
        raise bad(f"'seed' is {seed}, out of range [0, 2**64)")
    need(m, "shuffle", bool, bad)
    need(m, "schema", dict, bad)
    source = need(m, "source", dict, bad)
    count(source, "records", bad, where="source.", optional=True)
    inputs = source.get("inputs")
    if inputs is not None and not (isinstance(inputs, list) or (isinstance(inputs, int)
                                                                 and not isinstance(inputs, bool))):
        raise bad("'source.inputs' must be a list or a count")
    skipped = need(source, "skipped", dict, bad, where="source.", optional=True)
    if skipped is not None:
        count(skipped, "count", bad, where="source.skipped.")
        need(skipped, "records", list, bad, where="source.skipped.", optional=True)
    for name, split in m["splits"].items():
        for key in ("tokens", "events"):
            count(split, key, bad, where=f"splits.{name}.", optional=True)
    for rel in need(m, "companions", list, bad, optional=True) or ():
        if not isinstance(rel, str) or not safe_relative(rel):
            raise bad(f"'companions' holds {rel!r}, not a plain relative path inside the dataset folder")
    need(m, "format_options", dict, bad, optional=True)  # the format's options (kit/options.py), as given
    _check_records(m, source, bad)
    files = need(m, "files", list, bad, optional=True)
    for entry in files or ():
        file_entry(entry, bad, "files[]")


def _check_records(m: dict[str, Any], source: dict[str, Any], bad: Any) -> None:
    """The numbers a run records for people and for ``inspect`` (what it read, what cleaning removed,
    each schema field's raggedness): read by no loader, yet typed, so that no reader ever shows a lie."""
    count(source, "input_bytes", bad, where="source.", optional=True)
    sizes = need(source, "input_sizes", list, bad, where="source.", optional=True)
    if sizes is not None and not all(_is_count(x) for x in sizes):
        raise bad("'source.input_sizes' must be a list of sizes")
    count(m, "copies", bad, optional=True, low=1)
    for name, field in m["schema"].items():
        if isinstance(field, dict):
            need(field, "ragged", bool, bad, where=f"schema.{name}.", optional=True)
    cleaning = need(m, "cleaning", dict, bad, optional=True)
    if cleaning is not None:
        removed = need(cleaning, "removed", dict, bad, where="cleaning.", optional=True) or {}
        for key in removed:
            count(removed, key, bad, where="cleaning.removed.")
        need(cleaning, "provenance", bool, bad, where="cleaning.", optional=True)


def fraction(m: dict[str, Any], key: str, bad: Any, *, where: str = "", optional: bool = False) -> float | None:
    """``m[key]``, a share: a number in [0, 1]."""
    value = need(m, key, (int, float), bad, where=where, optional=optional)
    if value is not None and not 0 <= value <= 1:
        raise bad(f"'{where}{key}' is {value}, not a share in [0, 1]")
    return value


def check_events_schema(m: dict[str, Any], bad: Any) -> None:
    for name, field in m["schema"].items():
        if not isinstance(field, dict):
            raise bad(f"'schema.{name}' must be an object")
        dtype_of(need(field, "dtype", str, bad, where=f"schema.{name}."), bad, f"'schema.{name}.dtype'")
        shape = need(field, "shape", list, bad, where=f"schema.{name}.", optional=True) or []
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 31 for d in shape):
            raise bad(f"'schema.{name}.shape' must be a list of sizes")
        counter = need(field, "counter", str, bad, where=f"schema.{name}.", optional=True, nullable=True)
        if counter == "":
            raise bad(f"'schema.{name}.counter' is empty")
        if field.get("ragged", counter is not None) != (counter is not None):  # the record of what counter says
            raise bad(f"'schema.{name}.ragged' is {field['ragged']!r}, but its counter is {counter!r}")
    from shardsmith.core.provenance import check_manifest

    check_manifest(m, bad)


def dtype_of(value: str, bad: Any, name: str) -> Any:
    """A dtype the manifest names, from the allow-list (``core.dtypes``), or ``bad``."""
    from shardsmith.core.dtypes import safe_dtype

    try:
        return safe_dtype(value, field=name)
    except DatasetError as exc:
        raise bad(str(exc)) from None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


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
