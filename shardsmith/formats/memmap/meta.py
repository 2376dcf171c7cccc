"""``{split}.memmap.json``: what a user's training script reads before ``np.memmap`` (shape, dtype,
fields, the files of the lengths and scalars), and its checks on the way back in.

Written once per split, deterministic (no time, no absolute path). Read back (loader, ``verify``),
it is trusted only as far as it agrees with the manifest and the files: every path must be one
the manifest lists for the split, and every array's shape times its itemsize must be its file's
size, so a JSON that lies about a size is refused before anything is mapped.

Beyond paths and sizes: every dtype passes the allow-list (``core/dtypes.py``) and N and L equal
the manifest's. ``verify`` runs the same check (``Format.verify_layout``, no data read); ``verify
--deep`` (``MemmapDataset.check``) also checks lengths = min(counts, L) and that every row is
``pad_value`` past its length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.dtypes import safe_dtype
from shardsmith.core.manifest import MAX_COUNT
from shardsmith.errors import DatasetError
from shardsmith.formats.memmap.shape import FORMAT, FORMAT_VERSION, PAD_VALUE, Layout

MAX_META_BYTES = 16 << 20
HOW_TO_READ = ("values = np.memmap(values.path, dtype=values.dtype, mode='r', shape=tuple(values.shape)); "
               "event i holds values[i, :lengths[i]]; the rest of its row is pad_value; "
               "mask = np.arange(max_len) < lengths[:, None]; counts[i] is the event's length before truncation")


def meta_bytes(*, split: str, layout: Layout, names: dict[str, Any], events: int, truncated: int) -> bytes:
    n, length, width = events, layout.max_len, len(layout.features)
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "split": split, "events": n,
        "max_len": length, "keep": str(layout.keep), "pad_value": PAD_VALUE, "truncated_events": truncated,
        "values": {"path": names["values"], "dtype": layout.dtype.str, "shape": [n, length, width], "order": "C",
                   "fields": [f.name for f in layout.features],
                   "source_dtypes": {f.name: f.dtype for f in layout.features}},
        "lengths": {"path": names["lengths"], "dtype": "<i8", "shape": [n]},
        "counts": {"path": names["counts"], "dtype": "<i8", "shape": [n]},
        "scalars": {f.name: {"path": names["scalars"][f.name], "dtype": f.np_dtype.newbyteorder("<").str,
                             "shape": [n, *f.shape]} for f in layout.scalars},
        "how_to_read": HOW_TO_READ,
    }
    return (json.dumps(meta, indent=1) + "\n").encode()


@dataclass(frozen=True)
class Array:
    """One array of a split as the JSON describes it, checked: a path inside the folder, a dtype of
    the allow-list, a shape whose bytes are the file's size."""

    path: Path
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class SplitArrays:
    meta: dict[str, Any]
    values: Array
    lengths: Array
    counts: Array
    scalars: dict[str, Array]
    fields: list[str]


def read_meta(root: Path | str, manifest: dict[str, Any], split: str, *,
              fetch: Callable[[dict[str, Any]], bytes] | None = None) -> SplitArrays:
    """The split's JSON, checked against the manifest and the files (DatasetError, one line).
    ``fetch``: a dataset at a URL (``root``), whose JSON is fetched by its manifest entry (its size
    and sha256 checked on the way); its arrays' paths are then only their names in the dataset."""
    shards = manifest["splits"][split]["shards"]
    if len(shards) != 1:
        raise DatasetError(f"{root}: split {split!r} lists {len(shards)} array files, a memmap split has one")
    shard = shards[0]
    arrays = shard["arrays"]
    listed = {shard["path"]: shard["bytes"], arrays["lengths"]["path"]: arrays["lengths"]["bytes"],
              arrays["counts"]["path"]: arrays["counts"]["bytes"],
              **{e["path"]: e["bytes"] for e in arrays["scalars"].values()}}
    where = arrays["meta"]["path"]
    here = f"{root}/{where}"
    if fetch is not None and arrays["meta"]["bytes"] > MAX_META_BYTES:
        raise DatasetError(f"{here}: {arrays['meta']['bytes']} bytes, more than a memmap description holds")
    path = Path(where) if fetch is not None else manifest_mod.resolve_inside(root, where)
    try:
        if fetch is None:
            size = path.stat().st_size
            if size != arrays["meta"]["bytes"] or size > MAX_META_BYTES:
                raise DatasetError(f"{path}: {size} bytes, the manifest says {arrays['meta']['bytes']}")
        meta = json.loads(path.read_bytes() if fetch is None else fetch(arrays["meta"]))
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError:
        raise DatasetError(f"{here}: not JSON") from None
    located = (lambda rel: Path(rel)) if fetch is not None else (lambda rel: manifest_mod.resolve_inside(root, rel))
    try:
        n = shard["samples"]
        if not isinstance(meta, dict):
            raise DatasetError(f"{here}: not a memmap description (a JSON object)")
        for key in ("events", "max_len", "truncated_events"):
            if type(meta.get(key)) is not int or not 0 <= meta[key] <= MAX_COUNT:
                raise DatasetError(f"{here}: {key!r} is {meta.get(key)!r}, not a count")
        if meta["max_len"] != (manifest.get("memmap") or {}).get("max_len", meta["max_len"]):
            raise DatasetError(f"{here}: 'max_len' is {meta['max_len']}, the manifest says "
                               f"{manifest['memmap']['max_len']}")
        if meta["events"] != n or meta["truncated_events"] != shard.get("truncated", meta["truncated_events"]):
            raise DatasetError(f"{here}: {meta['events']} events ({meta['truncated_events']} truncated), the "
                               f"manifest says {n} ({shard.get('truncated')})")
        pad = meta.get("pad_value")
        if isinstance(pad, bool) or not isinstance(pad, int | float) or not math.isfinite(pad) \
                or not isinstance(meta.get("keep"), str):
            raise DatasetError(f"{here}: 'pad_value' must be a number and 'keep' a name")
        values = _array(located, here, meta["values"], listed, where, "values")
        fields = meta["values"]["fields"]
        if not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            raise DatasetError(f"{here}: 'values.fields' must be a list of names")
        want = (n, meta["max_len"], len(fields))
        if values.shape != want or values.path.name != shard["path"]:
            raise DatasetError(f"{here}: values {list(values.shape)} in {values.path.name}, the manifest "
                               f"says {list(want)} in {shard['path']}")
        if values.dtype.kind != "f":
            raise DatasetError(f"{here}: values dtype {values.dtype}, a memmap dataset holds floats")
        lengths = _array(located, here, meta["lengths"], listed, where, "lengths")
        counts = _array(located, here, meta["counts"], listed, where, "counts")
        scalars = {name: _array(located, here, e, listed, where, f"scalars.{name}") for name, e in meta["scalars"].items()}
        for name, a in (("lengths", lengths), ("counts", counts), *scalars.items()):
            if a.shape[:1] != (n,):
                raise DatasetError(f"{here}: {name} has {a.shape[:1]} rows, the split has {n} events")
        for name, a in (("lengths", lengths), ("counts", counts)):
            if a.dtype.kind not in "iu" or len(a.shape) != 1:
                raise DatasetError(f"{here}: {name} must be one integer per event")
    except (KeyError, TypeError, AttributeError) as exc:
        raise DatasetError(f"{here}: not a memmap description ({type(exc).__name__}: {exc})") from None
    return SplitArrays(meta=meta, values=values, lengths=lengths, counts=counts, scalars=scalars, fields=fields)


def _array(located: Callable[[str], Path], here: str, entry: dict[str, Any], listed: dict[str, int], where: str,
           what: str) -> Array:
    rel = entry["path"]
    if not isinstance(rel, str) or rel not in listed:
        raise DatasetError(f"{here}: {what} names {rel!r}, which the manifest does not list for this split")
    dtype = safe_dtype(entry["dtype"], field=f"{where}: {what}.dtype")
    shape = entry["shape"]
    if not (isinstance(shape, list) and shape and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)):
        raise DatasetError(f"{here}: {what}.shape {shape!r} is not a list of sizes")
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes != listed[rel]:
        raise DatasetError(f"{here}: {what} of shape {shape} and dtype {dtype} needs {nbytes:,} bytes, "
                           f"{rel} has {listed[rel]:,}")
    return Array(path=located(rel), dtype=dtype, shape=tuple(shape))
