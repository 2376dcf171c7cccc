"""The index folder (issue 17, point 3): a tar dataset's offset indexes and wids shard lists are in
``OUT/__index__/``, so that whoever takes the folder's files by name (``datasets``' webdataset
builder: tests/test_card.py; a glob over the shards) finds the tars alone. wids reads the shards
through ``__index__/{split}.wids.json`` (urls ``../{split}-N.tar``), webdataset through the shard
glob; a dataset written before the change (indexes beside the shards) still loads and verifies, and
``--overwrite`` replaces either layout, leaving no index behind and never a file of the user's.
"""

from __future__ import annotations

import glob
import hashlib
import json
import shutil
from pathlib import Path

import orjson
import pytest
from conftest import make_docs, run_cli, write_jsonl

import shardsmith


def _convert(src: Path, out: Path, *extra: str) -> Path:
    res = run_cli("convert", src, "--to", "webdataset", "--text-field", "text", "-o", out, "-q", "--workers", "1",
                  *extra)
    assert res.exit_code == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def tars(tmp_path_factory) -> Path:
    """JSONL text in four train shards and one val shard."""
    root = tmp_path_factory.mktemp("index-folder")
    write_jsonl(root / "in" / "a.jsonl", make_docs(90, seed=4))
    return _convert(root / "in", root / "out", "--shard-samples", "20", "--split", "train=0.8,val=0.2")


def _keys(out: Path, split: str = "train") -> list[str]:
    ds = shardsmith.open(out, split=split)
    return [ds[i]["__key__"] for i in range(len(ds))]


def test_the_top_of_the_folder_holds_the_shards_and_the_indexes_are_below(tars):
    m = orjson.loads((tars / "manifest.json").read_bytes())
    shards = [s["path"] for split in m["splits"].values() for s in split["shards"]]
    assert sorted(p.name for p in tars.iterdir()) == sorted(["README.md", "__index__", "manifest.json", *shards])
    assert len(shards) == 5 and all(s.endswith(".tar") for s in shards)
    for name, split in m["splits"].items():
        assert split["wids"] == f"__index__/{name}.wids.json"
        for shard in split["shards"]:
            assert shard["index"]["path"] == f"__index__/{shard['path'].removesuffix('.tar')}.offsets.npy"
    assert sorted(f["path"] for f in m["files"]) == ["__index__/train.wids.json", "__index__/val.wids.json"]
    wids = orjson.loads((tars / "__index__" / "val.wids.json").read_bytes())
    assert [e["url"] for e in wids["shardlist"]] == ["../val-000000.tar"]


def test_wids_reads_the_shards_through_the_index_folder(tars, tmp_path, monkeypatch):
    """By an absolute path and by one relative to the working folder; in place (``localname``) and
    through a cache of copies (``cache_dir``)."""
    wids = pytest.importorskip("wids")
    want = shardsmith.open(tars, split="train")
    monkeypatch.chdir(tars.parent)
    for spec, how in [(str(tars / "__index__" / "train.wids.json"), {"localname": lambda url: url}),
                      (f"{tars.name}/__index__/train.wids.json", {"cache_dir": str(tmp_path / "wids")})]:
        ds = wids.ShardListDataset(spec, transformations=[], **how)
        assert len(ds) == len(want) == 75
        for i in (0, 19, 20, 74):
            got = ds[i]
            assert got["__key__"] == want[i]["__key__"] and got[".txt"].read().decode() == want[i]["txt"]
        ds.close()


def test_webdataset_reads_the_shard_glob(tars):
    wds = pytest.importorskip("webdataset")
    shards = sorted(glob.glob(str(tars / "train-*")))  # the folder's files named after the split: the tars alone
    assert [Path(s).name for s in shards] == [f"train-{i:06d}.tar" for i in range(4)]
    got = [s["__key__"] for s in wds.WebDataset(shards, shardshuffle=False)]
    assert got == _keys(tars)
    braces = str(tars / "train-{000000..000003}.tar")
    assert [s["__key__"] for s in wds.WebDataset(braces, shardshuffle=False)] == got


def old_layout(new: Path, old: Path) -> Path:
    """``new`` as shardsmith wrote it before the index folder: every index beside its shard, wids
    urls that are the shards' names, the manifest naming them there (``files``: their sizes and
    sha256)."""
    shutil.copytree(new, old)
    m = orjson.loads((old / "manifest.json").read_bytes())
    for split in m["splits"].values():
        for shard in split["shards"]:
            name = Path(shard["index"]["path"]).name
            (old / shard["index"]["path"]).rename(old / name)
            shard["index"]["path"] = name
        wids = orjson.loads((old / split["wids"]).read_bytes())
        for entry in wids["shardlist"]:
            entry["url"] = Path(entry["url"]).name
        (old / split["wids"]).unlink()
        split["wids"] = Path(split["wids"]).name
        (old / split["wids"]).write_bytes(orjson.dumps(wids, option=orjson.OPT_INDENT_2))
    (old / "__index__").rmdir()
    m["files"] = [{"path": f["path"], "bytes": (old / f["path"]).stat().st_size,
                   "sha256": hashlib.sha256((old / f["path"]).read_bytes()).hexdigest()}
                  for f in ({"path": Path(f["path"]).name} for f in m["files"])]
    (old / "manifest.json").write_text(json.dumps(m, indent=2))
    return old


def test_a_dataset_of_the_old_layout_loads_verifies_and_is_replaced(tars, tmp_path):
    old = old_layout(tars, tmp_path / "old")
    assert not (old / "__index__").exists() and (old / "train-000000.offsets.npy").is_file()
    for split in ("train", "val"):
        new_ds, old_ds = shardsmith.open(tars, split=split), shardsmith.open(old, split=split)
        assert [old_ds[i] for i in range(len(old_ds))] == [new_ds[i] for i in range(len(new_ds))]
    res = run_cli("verify", old, "--deep")
    assert res.exit_code == 0, res.output
    # a rewrite of it in place: the new layout, and no index of the old one left at the top
    _convert(tars.parent / "in", old, "--shard-samples", "20", "--split", "train=0.8,val=0.2", "--overwrite")
    assert sorted(p.name for p in old.iterdir()) == sorted(p.name for p in tars.iterdir())
    assert sorted(p.name for p in (old / "__index__").iterdir()) == sorted(p.name for p in (tars / "__index__").iterdir())


def test_overwrite_clears_the_index_folder_but_never_a_file_of_the_users(tars, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tars, out)
    _convert(tars.parent / "in", out, "--overwrite")  # one split, one shard: the other indexes go
    assert sorted(p.name for p in (out / "__index__").iterdir()) == ["train-000000.offsets.npy", "train.wids.json"]
    (out / "__index__" / "notes.txt").write_text("mine\n")
    res = run_cli("convert", tars.parent / "in", "--to", "webdataset", "--text-field", "text", "-o", out, "-q",
                  "--overwrite")
    assert res.exit_code == 2 and "__index__/notes.txt" in res.stderr, res.stderr
    assert (out / "__index__" / "notes.txt").read_text() == "mine\n"
