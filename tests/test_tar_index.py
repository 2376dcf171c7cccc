"""The offset index (version 2) that the webdataset writers leave beside each shard: its member
table equals a parse of the tar's headers, whichever path wrote it; the loader reads it instead of
the headers, refuses one that changed or belongs to another shard, and still reads version 1; and
the input listing a child process makes ahead of the converter equals the one it would make."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import jpeg_folder, member_table, run_cli, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardsmith.engine.inputs import files as inputs
from shardsmith.errors import DatasetError, UsageError
from shardsmith.formats.webdataset.tarfmt import (
    BLOCK,
    index_array,
    index_members,
    index_offsets,
    is_index_v2,
    parse_members,
)
from shardsmith.formats.webdataset.writer import offsets_name
from shardsmith.loader import TarDataset


def convert(*args: str | Path) -> Path:
    res = run_cli("convert", *args, "--to", "webdataset", "--quiet")
    assert res.exit_code == 0, res.stderr
    return Path(args[args.index("-o") + 1])


def shards(out: Path) -> list[Path]:
    return sorted(out.glob("*.tar"))


def index_of(tar: Path) -> Path:
    return tar.parent / offsets_name(tar.name)


def rewrite_manifest_entry(out: Path, tar: Path) -> None:
    """The manifest's index entry of ``tar`` as its index now is (size and sha256)."""
    m = json.loads((out / "manifest.json").read_text())
    idx = index_of(tar)
    for split in m["splits"].values():
        for shard in split["shards"]:
            if shard["path"] == tar.name:
                shard["index"].update(bytes=idx.stat().st_size, sha256=hashlib.sha256(idx.read_bytes()).hexdigest())
    (out / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return jpeg_folder(tmp_path_factory.mktemp("imgs") / "imgs", classes=3, per_class=7)


@pytest.fixture(scope="module")
def converted(images, tmp_path_factory) -> Path:
    return convert(images, "-o", tmp_path_factory.mktemp("out") / "out", "--shard-samples", "5")


@pytest.mark.parametrize("how", ["direct", "shuffle path", "jsonl"])
def test_the_index_is_the_tar_headers_parsed(images, tmp_path, how):
    """Planned image shards, the keyed shuffle's image shards (file references) and inline
    samples (JSONL) all get an index whose table is exactly what a member-by-member parse finds."""
    if how == "jsonl":
        src = write_jsonl(tmp_path / "docs.jsonl", [f"doc {i} " * (i % 7 + 1) for i in range(40)])
        out = convert(src, "-o", tmp_path / "out", "--shard-samples", "9", "--text-field", "text")
    else:
        extra = ("--on-error", "skip") if how == "shuffle path" else ()
        out = convert(images, "-o", tmp_path / "out", "--shard-samples", "4", *extra)
    assert len(shards(out)) >= 3
    for tar in shards(out):
        arr = np.load(index_of(tar))
        assert is_index_v2(arr)
        offsets = index_offsets(arr, where=str(tar))
        found = index_members(arr, where=str(tar))
        want = member_table(tar.read_bytes(), offsets)
        got = (found.keys, found.first.tolist(), found.data.tolist(), found.size.tolist(), found.ext.tolist(),
               found.exts)
        assert got == want


def test_version_1_indexes_are_still_read(converted, tmp_path):
    out = tmp_path / "v1"
    shutil.copytree(converted, out)
    new = TarDataset(converted)
    for tar in shards(out):
        arr = np.load(index_of(tar))
        np.save(index_of(tar), index_offsets(arr, where=str(tar)).copy())  # only where samples start
        rewrite_manifest_entry(out, tar)
        assert not is_index_v2(np.load(index_of(tar)))
    old = TarDataset(out)
    assert len(old) == len(new) == 21
    for i in range(len(new)):
        assert old[i] == new[i]


def test_a_changed_index_is_refused(converted, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(converted, out)
    idx = index_of(shards(out)[1])
    raw = bytearray(idx.read_bytes())
    raw[-3] ^= 0x01  # a key's byte: consistent in itself, so only the manifest's sha256 tells
    idx.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="sha256 differs"):
        TarDataset(out)


def test_the_index_of_another_shard_is_refused(converted, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(converted, out)
    first, second = shards(out)[:2]
    shutil.copy(index_of(second), index_of(first))  # five samples each: every count agrees
    rewrite_manifest_entry(out, first)
    ds = TarDataset(out)
    with pytest.raises(DatasetError, match="does not describe sample 0"):
        ds[0]
    assert ds[5]["__key__"]  # the other shards still read


def rekey(tar: Path, start: int, stop: int) -> None:
    """Give every member header in bytes [start, stop) of a tar another key (its first letter
    changed), with a correct checksum: a tar that GNU tar still reads, unlike its index."""
    raw = bytearray(tar.read_bytes())
    for _, data, _ in parse_members(bytes(raw), start, stop):
        at = data - BLOCK
        raw[at] = ord("Z") if raw[at] != ord("Z") else ord("Y")
        raw[at + 148:at + 156] = b" " * 8
        raw[at + 148:at + 156] = b"%06o\x00 " % sum(raw[at:at + BLOCK])
    tar.write_bytes(bytes(raw))


def test_a_rewritten_header_is_caught_where_the_index_is_checked_against_the_tar(converted, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(converted, out)
    tar = shards(out)[0]
    offsets = index_offsets(np.load(index_of(tar)), where="")
    rekey(tar, int(offsets[0]), int(offsets[1]))  # every member of the first sample: another key
    ds = TarDataset(out)
    with pytest.raises(DatasetError, match="does not describe sample 0"):
        ds[3]


def valid_index() -> np.ndarray:
    # three samples: (jpg, cls), (jpg, cls, txt), (cls): headers back to back from byte 0
    members = [[("jpg", 700), ("cls", 1)], [("jpg", 10), ("cls", 2), ("txt", 0)], [("cls", 3)]]
    offsets, first, data, size, names, pos = [0], [0], [], [], [], 0
    for sample in members:
        for ext, n in sample:
            data.append(pos + BLOCK)
            size.append(n)
            names.append(ext)
            pos += BLOCK + n + (-n % BLOCK)
        offsets.append(pos)
        first.append(len(data))
    return index_array(offsets, first, data, size, names, ["a", "b2", "c"])


def test_index_members_reads_back_what_index_array_wrote():
    found = index_members(valid_index(), where="x")
    assert found.keys == ["a", "b2", "c"] and found.exts == ["jpg", "cls", "txt"]
    assert found.first.tolist() == [0, 2, 5, 6] and found.ext.tolist() == [0, 1, 0, 1, 2, 1]
    assert found.size.tolist() == [700, 1, 10, 2, 0, 3]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_damaged_index_raises_dataset_error_or_is_whole(data):
    """Any number changed: the checks name a fault, or the table is still one whose members fill
    their samples back to back (never an exception of another kind, never members out of place)."""
    arr = valid_index().copy()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(arr) - 1))
        arr[i] = data.draw(st.sampled_from([0, 1, -1, 2**62, -(2**63)]) | st.integers(-2000, 2000)
                           | st.just(int(arr[i]) ^ (1 << data.draw(st.integers(0, 62)))))
    try:
        offsets = index_offsets(arr, where="x")
        if offsets[0] != 0 or (np.diff(offsets) < BLOCK).any() or (offsets % BLOCK).any():
            return  # the loader's own offset checks refuse these first
        found = index_members(arr, where="x")
    except DatasetError:
        return
    for j in range(len(found.keys)):
        pos = int(offsets[j])
        for k in range(found.first[j], found.first[j + 1]):
            assert found.data[k] == pos + BLOCK and 0 <= found.ext[k] < len(found.exts)
            pos = int(found.data[k] + found.size[k] + (-found.size[k] % BLOCK))
        assert pos == offsets[j + 1]


# -- listing ahead ----------------------------------------------------------------------------------


def a_tree(root: Path) -> Path:
    for rel in ["b/2.jpg", "b/1.JPG", "a/x.png", "a/deep/3.jpeg", "a/.hidden.jpg", ".dot/4.jpg", "top.jpg",
                "a/notes.txt", "c/5.webp"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(rel.encode())
    outside = root.parent / "elsewhere"
    outside.mkdir()
    (outside / "6.jpg").write_bytes(b"6")
    (root / "link").symlink_to(outside)  # a symlinked folder: followed
    (root / "a" / "loop").symlink_to(root / "a")  # back to its parent: not followed again
    return root


SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_the_listing_made_ahead_is_the_one_discover_makes(tmp_path, monkeypatch):
    root = a_tree(tmp_path / "tree")
    want = inputs.discover([str(root)], suffixes=SUFFIXES)
    assert [f.rel for f in want] == ["a/deep/3.jpeg", "a/x.png", "b/1.JPG", "b/2.jpg", "c/5.webp", "link/6.jpg",
                                     "top.jpg"]
    assert [f.group for f in want][:2] == ["a", "a"] and want[-1].group == ""
    monkeypatch.setattr(inputs.threading, "active_count", lambda: 1)  # earlier tests may leave threads behind
    with inputs.walk_soon([str(root), str(tmp_path / "missing")]):
        assert str(root) in inputs._SOON

        def no_walk(*args, **kwargs):
            raise AssertionError("the parent listed the folder itself")

        monkeypatch.setattr(inputs, "_walk", no_walk)
        assert inputs.discover([str(root)], suffixes=SUFFIXES) == want
    assert not inputs._SOON


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_listings_nobody_took_are_reaped_and_a_bad_answer_falls_back(tmp_path, monkeypatch):
    root = a_tree(tmp_path / "tree")
    monkeypatch.setattr(inputs.threading, "active_count", lambda: 1)
    with inputs.walk_soon([str(root)]):
        assert str(root) in inputs._SOON
        pid = inputs._SOON[str(root)].pid  # never taken: the child is waited for, no zombie is left
    assert not inputs._SOON
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    assert inputs._decode(str(root), b"not a listing") is None
    assert inputs._decode(str(root), inputs._encode([])) == []
    rows = inputs._walk(str(root), None)
    assert inputs._decode(str(root), inputs._encode(rows)) == rows


def test_the_input_kind_comes_from_the_suffixes():
    from shardsmith import registry
    from shardsmith.engine.choose import infer_source

    sources = registry.loaded("source")
    files = [inputs.InputFile(path=f"/d/{n}", rel=n, index=i, size=1) for i, n in
             enumerate(["a.jsonl", "b.JSONL.gz", "c.ndjson"])]
    assert infer_source(files, sources) == "jsonl"
    assert infer_source([inputs.InputFile(path="/d/x.JPEG", rel="x.JPEG", index=0, size=1)], sources) == "imagefolder"
    mixed = [*files, inputs.InputFile(path="/d/p.parquet", rel="p.parquet", index=3, size=1)]
    with pytest.raises(UsageError, match="several kinds"):
        infer_source(mixed, sources)


def test_check_headers_reads_every_header_against_the_index(images, tmp_path):
    """``ds[i]`` checks a few samples per shard against the tar; ``check_headers`` (for
    ``verify --deep``) checks them all, and finds a sample between the spot checks."""
    out = convert(images, "-o", tmp_path / "ds", "--shard-samples", "100")
    TarDataset(out).check_headers()
    (tar,) = shards(out)
    offsets = index_offsets(np.load(index_of(tar)), where="")
    rekey(tar, int(offsets[1]), int(offsets[2]))  # sample 1: another key
    ds = TarDataset(out)
    assert ds[1]["__key__"][0] not in "ZY"  # not among the spot checks: read where the index says
    with pytest.raises(DatasetError, match="does not describe sample 1 "):
        ds.check_headers()
