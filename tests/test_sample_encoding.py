"""A format encodes its own samples (issue 45, item 1): a source gives a record's typed fields
(``Reader.sample_fields``), the worker makes them a neutral ``Sample`` (``kit/sample.py``), and the
chosen format's encoder (``Format.encoder``) makes its bytes. Webdataset's tar members come from the
webdataset format; a new format that gives no encoder gets the neutral sample, typed as the source
gave it, and never parses another format's bytes (``tests/folder_format.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from folder_format import FolderFormat, registered

from shardsmith import registry
from shardsmith.formats.webdataset.members import TarMembers
from shardsmith.formats.webdataset.tarfmt import parse_sample
from shardsmith.kit.format import Format, WriteJob
from shardsmith.kit.reader import Reader, RecordError
from shardsmith.kit.sample import NeutralEncoder, Sample

ROWS = [{"id": 0, "score": 0.5, "ok": True, "tags": ["a", "b"], "meta": {"n": None}, "text": "caf\u00e9"},
        {"id": 1, "score": -2.25, "ok": False, "tags": [], "meta": {"n": 3}, "text": "two"}]


def test_the_neutral_sample_reads_back_typed():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    sample = Sample(key="k-r0-1234", text="doc", fields={
        "s": "x", "b": b"\x00\xff", "i": 7, "f": 1.5, "t": True, "none": None, "list": [1, "a"],
        "a": array, "empty": b"", "big": np.arange(3, dtype=np.int64)})
    back = Sample.decode(sample.encode())
    assert back.key == sample.key and back.text == "doc" and list(back.fields) == list(sample.fields)
    for name in ("s", "b", "i", "f", "t", "none", "list", "empty"):
        assert back.fields[name] == sample.fields[name] and type(back.fields[name]) is type(sample.fields[name])
    assert back.fields["a"].dtype == np.float32 and back.fields["a"].shape == (2, 3)
    assert np.array_equal(back.fields["a"], array) and np.array_equal(back.fields["big"], sample.fields["big"])
    within = memoryview(b"junk" + sample.encode() + b"next")[4:-4]  # a writer's slice of its payload
    assert Sample.decode(within).fields["i"] == 7 and np.array_equal(Sample.decode(within).fields["a"], array)


def test_webdataset_members_come_from_the_webdataset_format():
    job = WriteJob(opts=None, out=Path("."))
    tar = registry.format_for(option="webdataset", holds="rows")
    assert isinstance(tar.encoder(job, "rows"), TarMembers)
    assert tar.encoder(WriteJob(opts=None, out=Path("."), sources=["a.jpg"]), "images").by_reference
    assert isinstance(Format().encoder(job, "rows"), NeutralEncoder)  # a format that gives none
    assert not hasattr(Reader, "fields"), "a source gives fields, never a format's members"
    sample = Sample(key="k-r0-1234", fields={"img.png": b"PNG", "id": 3, "arr": np.arange(2)}, text="hi")
    data = b"".join(TarMembers().encode(sample))
    key, found = parse_sample(data, 0, len(data), len(data))
    members = {ext: data[at:at + size] for ext, at, size in found}
    assert key == sample.key and list(members) == ["img_png", "json", "txt"]  # binary fields, then the rest as json, then the text
    assert members["json"] == b'{"id":3,"arr":[0,1]}' and members["txt"] == b"hi"
    # the manifest's schema names the members too: the source describes fields, webdataset its members
    described = {"*": {"kind": "json"}, "binary columns": {"kind": "bytes", "ext": "column name"}}
    assert TarMembers().schema(described, text_from="text") == {
        "json": {"kind": "json"}, "binary columns": {"kind": "bytes", "ext": "column name"},
        "txt": {"kind": "text", "from": "text"}}


def test_a_row_too_deep_for_json_is_a_bad_record_of_the_format():
    deep: list = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(RecordError, match="254 levels"):
        TarMembers().encode(Sample(key="k", fields={"x": deep}))


def test_a_new_format_gets_the_neutral_typed_sample(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    with registered():
        assert type(FolderFormat().encoder(WriteJob(opts=None, out=tmp_path), "rows")) is NeutralEncoder
        res = run_cli("convert", tmp_path / "in", "--to", "folders", "--text-field", "text", "--no-shuffle",
                      "-o", tmp_path / "out", "-q")
        assert res.exit_code == 0, res.stderr
        ds = FolderFormat().open(tmp_path / "out", split="train")
        got = [ds[i] for i in range(len(ds))]
    assert [{k: v for k, v in row.items() if k != "__key__"} for row in got] == ROWS  # typed as the source gave them
    assert all(row["__key__"].startswith("a_jsonl-r") for row in got)
    schema = json.loads((tmp_path / "out" / "manifest.json").read_text())["schema"]
    assert schema == {"*": {"kind": "json"}, "__text__": {"kind": "text", "from": "text"}}  # no member names


def test_a_source_that_still_makes_tar_members_is_told_in_one_line(tmp_path, monkeypatch):
    from shardsmith.sources.jsonl import JsonlReader

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"a": 1}\n', encoding="utf-8")
    monkeypatch.setattr(JsonlReader, "fields", lambda self, value: [("json", b"{}")], raising=False)
    res = run_cli("convert", tmp_path / "in", "--to", "webdataset", "-o", tmp_path / "out", "-q")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "sample_fields" in res.stderr, res.stderr


def test_a_new_format_of_images_gets_the_image_bytes_typed(tmp_path, monkeypatch):
    """Images too: the file's bytes (not a reference only webdataset's writer resolves), its
    extension and its class, as the source's files hold them."""
    from conftest import jpeg

    from shardsmith.core.sample import Identity

    images = tmp_path / "images"
    for name, (cls, seed) in {"a.jpg": ("cat", 1), "b.jpg": ("cat", 2), "c.jpg": ("dog", 3)}.items():
        (images / cls).mkdir(parents=True, exist_ok=True)
        (images / cls / name).write_bytes(jpeg(seed))
    monkeypatch.setattr(FolderFormat, "accepts", ("rows", "images"))
    with registered():
        res = run_cli("convert", images, "--to", "folders", "-o", tmp_path / "out", "-q")
        assert res.exit_code == 0, res.stderr
        ds = FolderFormat().open(tmp_path / "out", split="train")
        got = {row["__key__"]: row for row in (ds[i] for i in range(len(ds)))}
    files = sorted(p.relative_to(images).as_posix() for p in images.rglob("*.*"))
    assert sorted(got) == sorted(Identity(rel, 0).key() for rel in files)
    for rel in files:
        row = got[Identity(rel, 0).key()]
        assert row["image"] == (images / rel).read_bytes() and row["cls"] == ["cat", "dog"].index(rel.split("/")[0])
        assert row["ext"] == rel.rsplit(".", 1)[1]
