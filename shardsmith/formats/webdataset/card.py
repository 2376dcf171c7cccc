"""What the dataset card says of tar shards: the features HuggingFace ``datasets`` gives each member
extension (its ``webdataset`` builder decodes by extension), found in the shards' offset indexes."""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.manifest import resolve_inside
from shardsmith.errors import ShardsmithError
from shardsmith.formats.webdataset.json_feature import NoExactType, row_type, yaml_feature
from shardsmith.formats.webdataset.tarindex import index_extensions, index_members, is_index_v2
from shardsmith.kit.format import CardData

# what ``datasets``' webdataset builder makes of a member, by extension (datasets 5.2,
# packaged_modules/webdataset): images become Image features, these decode to text, JSON and ints
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"})
TEXT_EXTS = frozenset({"txt", "text", "transcript"})
JSON_EXTS = frozenset({"json", "jsn"})
INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id"})
# decoded to values whose type only the data tells (arrays, msgpack, ...): ``datasets`` infers those
INFERRED_EXTS = frozenset({"npy", "npz", "ten", "tb", "mp", "msg", "cbor", "pth"})
KEYS = [{"name": "__key__", "dtype": "string"}, {"name": "__url__", "dtype": "string"}]


def tar_card(out: Path, manifest: dict[str, Any], *, notes: tuple[str, ...] = ()) -> CardData:
    """Tar shards as the ``webdataset`` builder reads them, with features when every member's is known
    and ``datasets`` keeps it exactly."""
    exts = member_exts(out, manifest)
    features = None if exts is None else tar_features(exts, classes=manifest.get("classes"))
    if features is not None:
        try:
            features, said = exact_json(out, manifest, features)
            notes = (*notes, *said)
        except (OSError, ValueError, ShardsmithError):  # shards not here to read (a cluster stage's stand-in)
            features = None
    images = [e for e in exts or () if e.rsplit(".", 1)[-1].lower() in IMAGE_EXTS]
    notes = (*notes, data_dir_note(named=any("dtype" in f and isinstance(f["dtype"], dict) for f in features or ()),
                                   images=images))
    if features is None:
        notes = (*notes, "`datasets` infers the features from the first samples (this card does not name them).")
    return CardData(builder="webdataset", pattern="{split}-*.tar", features=features, notes=notes)


def exact_json(out: Path, manifest: dict[str, Any],
               features: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The features with each JSON member's typed exactly (``json_feature``: its rows read once from the
    shards), or left out, with a note, when its rows have no exact type: ``datasets``' own ``json``
    feature keeps 10 decimals, and a feature the card leaves out is a column ``datasets`` does not make.
    Shards that cannot be read raise (OSError, DatasetError): the card then names no features."""
    out_features, notes = [], []
    for feature in features:
        if feature.get("dtype") != "json":
            out_features.append(feature)
            continue
        ext = feature["name"]
        try:
            shape = row_type(member_bytes(out, manifest, ext))
        except NoExactType as exc:
            notes.append(f"The `{ext}` members (each row as it was read) are not a column here: their values have no "
                         f"one type that `datasets` keeps exactly ({exc}; its `json` type keeps 10 decimals). Read "
                         f"them with `shardsmith.open` or webdataset.")
            continue
        out_features.append(yaml_feature(ext, shape))
    return out_features, tuple(notes)


def member_bytes(out: Path, manifest: dict[str, Any], ext: str) -> Iterator[bytes]:
    """The bytes of every member named ``ext``, shard by shard, found by the shards' offset indexes."""
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            arr = np.load(resolve_inside(out, shard["index"]["path"]), mmap_mode="r", allow_pickle=False)
            table = index_members(np.asarray(arr, np.int64), where=shard["index"]["path"])
            if ext not in table.exts:
                continue
            rows = np.flatnonzero(table.ext == table.exts.index(ext))
            with open(resolve_inside(out, shard["path"]), "rb") as fh, \
                    mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                for start, size in zip(table.data[rows].tolist(), table.size[rows].tolist()):
                    yield mm[start:start + size]


def data_dir_note(*, named: bool, images: list[str]) -> str:
    """What ``load_dataset("webdataset", data_dir=...)`` makes of the folder (datasets 5.2): it takes
    the files named after its split keywords, which are the shards alone (the indexes are in
    ``__index__/``, a folder it skips), and reads no card: it infers the columns from the first 5
    samples, so images of several types (a ``jpg`` here, a ``png`` there) fail it, or lose the
    images of the types the first samples lack."""
    what = ("`cls` is then a plain `int64`; the class names come with `load_dataset(\"path/to/this/folder\")`, "
            "or by passing `features=` (this card's `dataset_info.features`)" if named else
            "the features are then inferred from the first samples")
    note = ("`load_dataset(\"webdataset\", data_dir=\"path/to/this/folder\")` reads the shards too (the indexes "
            "are in `__index__/`, which `datasets` skips) but not this card: " + what + ". It finds the splits "
            "by keywords in the file names (`train`; `val` becomes `validation`; `test`) and leaves out the "
            "shards of a split named otherwise (when no split has such a name, it takes `manifest.json` for "
            "a shard and fails).")
    if len(images) > 1:
        note += (f" The images here are of {len(images)} types ({', '.join(f'`{e}`' for e in images)}), a column "
                 f"each: without `features=` it fails on samples whose members differ (or, when its first "
                 f"samples are of one type, leaves the other types' images out); with this card's features "
                 f"each sample has its image in its type's column and None in the others.")
    return note


def tar_features(exts: list[str], *, classes: Any) -> list[dict[str, Any]] | None:
    """``dataset_info.features`` for samples of these member extensions; None when one of them
    decodes to a type the data alone tells."""
    features = []
    for ext in exts:
        last = ext.rsplit(".", 1)[-1].lower()
        if last in INFERRED_EXTS:
            return None
        if last == "cls" and isinstance(classes, list) and classes:
            dtype: Any = {"class_label": {"names": {str(i): str(c) for i, c in enumerate(classes)}}}
        elif last in IMAGE_EXTS:
            dtype = "image"
        elif last in TEXT_EXTS:
            dtype = "string"
        elif last in JSON_EXTS:
            dtype = "json"
        elif last in INT_EXTS:
            dtype = "int64"
        else:
            dtype = "binary"
        features.append({"name": ext, "dtype": dtype})
    return [*features, *KEYS]


def member_exts(out: Path, manifest: dict[str, Any]) -> list[str] | None:
    """Every member extension of the dataset's shards, in order of first use, from their offset
    indexes (the head and the names only). None if an index cannot tell: an old index, or a
    stand-in of a cluster stage's finalize whose shards are in object storage."""
    seen: dict[str, None] = {}
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            index = shard.get("index")
            if not isinstance(index, dict):
                return None
            try:
                arr = np.load(resolve_inside(out, index["path"]), mmap_mode="r", allow_pickle=False)
                if arr.dtype != np.int64 or not is_index_v2(arr):
                    return None
                seen.update(dict.fromkeys(index_extensions(arr, where=index["path"])))
            except (OSError, ValueError, ShardsmithError):
                return None
    return list(seen)
