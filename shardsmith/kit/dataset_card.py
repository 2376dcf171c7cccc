"""The dataset card: ``README.md`` in every output folder, for people and for HuggingFace ``datasets``.

Its YAML front matter is what ``datasets`` reads when it loads a folder (``load_dataset(OUT)``):
``configs`` (each split's shards, where ``datasets`` has a builder for the format) and
``dataset_info`` (features, with ``ClassLabel`` names for ``cls``, and the splits' sizes). Below
it, as text: the counts per split, how to load the dataset (with ``datasets`` where it can, with
shardsmith always), the sha256 of every shard and the command that made it.

The card is made from the manifest only (and the format's look at its shards' indexes), so it is
the same bytes for the same run: no time, no absolute path (an absolute path on the command line
is shown by its last part). It is documentation, not data: ``manifest.json`` does not list it and
``verify`` does not check it, so a user may edit it (as cards on the Hub are edited).

Details. It is written atomically by ``engine/finish.commit_dataset`` just before the manifest, so
a dataset always has one and it goes up with the shards to object storage (the manifest last).
``configs`` name each split's shards as a glob (``{split}-*.tar``, ``{split}-*.h5``);
``dataset_info.splits`` give ``num_examples`` (the split's samples) and ``num_bytes`` (its shards'
bytes, not the Arrow size ``datasets`` would compute); ``tags`` too. What a format says is its
``Format.card(out, manifest) -> CardData`` (``builder``, ``pattern``, ``features``, ``notes``): this
module knows no format. ``load_dataset("webdataset", data_dir=OUT)`` reads no README, which the card
says (``card.data_dir_note``); ``tests/test_card.py`` reads every kind through ``datasets``, sample
for sample against our loader, and ``tests/test_golden.py`` holds the card's digest. ``--overwrite``
removes it as shardsmith's own (``core/own_files.EVERY_OUTPUT``), but a ``README.md`` in a folder
with neither a manifest nor a run record is the user's and is never removed. A cluster run's card is
written by finalize (its command is finalize's); into object storage, finalize holds only sparse
stand-ins of the shards the gather ranks uploaded, so a tar card names no features there
(``datasets`` infers them, without class names).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any

from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.core.own_files import CARD
from shardsmith.core.urls import is_url, safe_argv
from shardsmith.kit.format import shard_entries

if TYPE_CHECKING:
    from shardsmith.kit.format import CardData, Format

_SPLIT_NAME = re.compile(r"\w+(\.\w+)*\Z")  # what ``datasets`` takes as a split name
_PLAIN = re.compile(r"[A-Za-z_][\w.\-]*\Z")  # a YAML scalar that needs no quotes (and is no bool or null)
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def write_card(out: Path, manifest: dict[str, Any], fmt: Format) -> None:
    """Write ``OUT/README.md`` atomically (before the manifest: a finished dataset always has one)."""
    atomic_write_bytes(Path(out) / CARD, render(manifest, fmt.card(Path(out), manifest), fmt=fmt).encode("utf-8"))


def render(manifest: dict[str, Any], data: CardData, *, fmt: Format) -> str:
    """The card's text."""
    front = yaml_block(front_matter(manifest, data))
    return "\n".join(["---", front.rstrip("\n"), "---", "", *_body(manifest, data, fmt), ""])


def front_matter(manifest: dict[str, Any], data: CardData) -> dict[str, Any]:
    """The YAML ``datasets`` reads: ``configs`` (where it has a builder) and ``dataset_info``."""
    splits = manifest["splits"]
    loadable = [s for s, v in splits.items() if v["samples"] and _SPLIT_NAME.match(s)]
    front: dict[str, Any] = {}
    if data.builder is not None and loadable:
        front["configs"] = [{"config_name": "default", "data_files": [
            {"split": s, "path": data.pattern.format(split=s)} for s in loadable]}]
    elif data.unreadable and loadable:
        front["configs"] = [{"config_name": "default", "data_files": [{"split": loadable[0], "path": data.unreadable}]}]
    info: dict[str, Any] = {}
    if data.features:
        info["features"] = data.features
    info["splits"] = [{"name": s, "num_bytes": _bytes(v), "num_examples": v["samples"]}
                      for s, v in splits.items() if _SPLIT_NAME.match(s)]
    total = sum(_bytes(v) for v in splits.values())
    info["download_size"] = total
    info["dataset_size"] = total
    front["dataset_info"] = info
    front["tags"] = ["shardsmith", str(manifest["format"])]
    return front


def _bytes(split: dict[str, Any]) -> int:
    return sum(int(s["bytes"]) for s in split["shards"])


def _body(manifest: dict[str, Any], data: CardData, fmt: Format) -> list[str]:
    splits = manifest["splits"]
    source = manifest.get("source") or {}
    inputs = source.get("inputs")
    n_inputs = len(inputs) if isinstance(inputs, list) else inputs
    lines = [f"# A {manifest['format']} dataset made by shardsmith", "",
             f"Made by shardsmith {manifest.get('tool_version', '?')} from {n_inputs} input file(s) "
             f"(reader `{source.get('reader', '?')}`), {'shuffled' if manifest.get('shuffle') else 'in input order'} "
             f"with seed {manifest.get('seed')}. `manifest.json` is the dataset's record (`shardsmith verify` "
             f"checks every file against it); this card is written from it.", ""]
    lines += _split_table(splits, unit=fmt.sample_unit)
    classes = manifest.get("classes")
    if isinstance(classes, list) and classes:
        lines += ["## Classes", "", "| cls | name |", "|---:|---|",
                  *(f"| {i} | {_cell(c)} |" for i, c in enumerate(classes)), ""]
    lines += _loading(manifest, data)
    lines += ["## Files", "", "The sha256 of every shard (and its index), as `manifest.json` records them.", "",
              "| file | bytes | sha256 |", "|---|---:|---|",
              *(f"| {_cell(e['path'])} | {e['bytes']} | `{e['sha256']}` |" for e in _entries(manifest, fmt)), ""]
    lines += ["## Command", "", "```", command_line(manifest.get("command") or []), "```", "",
              "(Absolute paths are shown by their last part.)"]
    return lines


def _split_table(splits: dict[str, Any], *, unit: str) -> list[str]:
    extra = [k for k in ("events", "tokens") if k != f"{unit}s" and any(k in v for v in splits.values())]
    head = ["split", f"{unit}s", *extra, "shards", "bytes"]
    rows = [[name, v["samples"], *(v.get(k, "") for k in extra), len(v["shards"]), _bytes(v)]
            for name, v in splits.items()]
    return ["## Splits", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1),
            *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows), ""]


def _loading(manifest: dict[str, Any], data: CardData) -> list[str]:
    first = next(iter(manifest["splits"]), "train")
    lines = ["## Loading", ""]
    if data.builder is not None:
        lines += ["With HuggingFace `datasets` (this card tells it the features and where each split's shards are):",
                  "", "```python", "from datasets import load_dataset", "",
                  'ds = load_dataset("path/to/this/folder")', "```", ""]
    else:
        lines += ["HuggingFace `datasets` has no builder that reads these shards; the YAML above describes them.", ""]
    for note in data.notes:
        lines += [note, ""]
    lines += ["With shardsmith:", "", "```python", "import shardsmith", "",
              f'ds = shardsmith.open("path/to/this/folder", split={json.dumps(first)})', "```", ""]
    return lines


def _entries(manifest: dict[str, Any], fmt: Format) -> list[dict[str, Any]]:
    """Every shard and the files that go with it (its companions), then the split-wide files its
    format's writers hashed (``Format.split_files``)."""
    return [*shard_entries(manifest), *fmt.split_files(manifest)]


def command_line(command: list[str]) -> str:
    """The command that made the dataset, as a shell line: URLs without credentials or query, and
    absolute paths by their last part (the card is the same wherever the run's files were)."""
    return " ".join(shlex.quote(_short(a)) for a in ["shardsmith", *safe_argv(list(command[1:]))])


def _short(arg: str) -> str:
    name, eq, value = arg.partition("=")
    if eq and name.startswith("--"):
        return f"{name}={_short_path(value)}"
    return _short_path(arg)


def _short_path(value: str) -> str:
    if is_url(value):
        return value
    for flavour in (PurePosixPath, PureWindowsPath):
        p = flavour(value)
        if p.is_absolute():
            return p.name or value
    return value


def _cell(value: Any) -> str:
    """A markdown table cell: its pipes escaped, on one line."""
    return str(value).replace("|", "\\|").replace("\n", " ")


# -- a small YAML writer: block style, keys in the order given, strings quoted when they need it ---------

def yaml_block(value: Any, indent: int = 0) -> str:
    """``value`` (dicts, lists, strings, numbers, booleans, None) as block-style YAML."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            k = _scalar(str(key))
            if _nested(item):
                out.append(f"{pad}{k}:\n{yaml_block(item, indent + (2 if isinstance(item, dict) else 0))}")
            else:
                out.append(f"{pad}{k}: {_scalar(item)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            if _nested(item):
                text = yaml_block(item, indent + 2)
                out.append(f"{pad}- {text[indent + 2:]}")
            else:
                out.append(f"{pad}- {_scalar(item)}\n")
        return "".join(out)
    return pad + _scalar(value) + "\n"


def _nested(value: Any) -> bool:
    return isinstance(value, dict | list) and bool(value)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar
