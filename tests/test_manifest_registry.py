"""The manifest as a trust boundary, and the plugin registry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import make_docs, run_cli, write_jsonl

import shardsmith
from shardsmith import registry
from shardsmith.kit import manifest_io


@pytest.fixture
def dataset(tmp_path, bpe_tokenizer) -> Path:
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(50))
    assert run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer,
                   "-q").exit_code == 0
    return tmp_path / "out"


def edit(out: Path, change) -> None:
    m = json.loads((out / "manifest.json").read_text())
    change(m)
    (out / "manifest.json").write_text(json.dumps(m))


def test_manifest_has_the_design_fields(dataset):
    m = manifest_io.load(dataset)
    for key in ("shardsmith", "format", "created", "tool_version", "command", "seed", "shuffle", "source",
                "schema", "splits", "tokenizer"):
        assert key in m
    shard = m["splits"]["train"]["shards"][0]
    assert set(shard) >= {"path", "samples", "bytes", "sha256", "tokens", "index"}
    assert m["tokenizer"]["dtype"] == "uint16" and m["tokenizer"]["eos_id"] == 0


@pytest.mark.parametrize("path", ["../escape.bin", "/etc/passwd", "a/../../b.bin", "", "..\\x.bin"])
def test_paths_outside_the_folder_are_refused(dataset, path):
    edit(dataset, lambda m: m["splits"]["train"]["shards"][0].__setitem__("path", path))
    with pytest.raises(shardsmith.DatasetError, match="not a plain relative path"):
        shardsmith.TokenDataset(dataset, seq_len=8)


def test_symlink_leading_out_is_refused(dataset, tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\0" * 64)
    os.symlink(outside, dataset / "link.bin")
    edit(dataset, lambda m: m["splits"]["train"]["shards"][0].__setitem__("path", "link.bin"))
    with pytest.raises(shardsmith.DatasetError, match="leads outside"):
        shardsmith.TokenDataset(dataset, seq_len=8)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("splits"), "missing fields: splits"),
    (lambda m: m.__setitem__("shardsmith", 99), "format version 99"),
    (lambda m: m["splits"]["train"].__setitem__("samples", 7), "do not add up"),
    (lambda m: m["splits"]["train"]["shards"][0].__setitem__("sha256", "zz"), "not a hex digest"),
    (lambda m: m["splits"]["train"]["shards"][0].__setitem__("bytes", -1), "'bytes' is not a count"),
])
def test_invalid_manifests_raise_our_error(dataset, change, message):
    edit(dataset, change)
    with pytest.raises(shardsmith.DatasetError, match=message):
        shardsmith.open(dataset)


def test_shard_size_mismatch_and_corrupt_idx(dataset):
    m = manifest_io.load(dataset)
    idx = dataset / m["splits"]["train"]["shards"][0]["index"]["path"]
    idx.write_bytes(idx.read_bytes()[:-8])
    with pytest.raises(shardsmith.DatasetError, match="index size"):
        shardsmith.open(dataset)
    (dataset / m["splits"]["train"]["shards"][0]["path"]).write_bytes(b"\0\0")
    with pytest.raises(shardsmith.DatasetError, match="not .* bytes as the manifest says"):
        shardsmith.TokenDataset(dataset, seq_len=4)


def test_not_json_manifest(dataset):
    (dataset / "manifest.json").write_text("{")
    with pytest.raises(shardsmith.DatasetError, match="not valid JSON"):
        shardsmith.open(dataset)


def test_plugins_lists_builtins_and_entry_points(monkeypatch):
    from importlib.metadata import EntryPoint, EntryPoints

    fancy = EntryPoint("fancy", "json:JSONDecoder", registry.GROUPS["source"])
    monkeypatch.setattr(registry, "entry_points", lambda: EntryPoints([fancy]))
    registry._installed.cache_clear()
    try:
        names = {(p.kind, p.name) for p in registry.plugins()}
        assert {("source", "jsonl"), ("source", "parquet"), ("format", "tokens"), ("source", "fancy")} <= names
        import json as json_mod

        assert registry.get("source", "fancy") is json_mod.JSONDecoder
        with pytest.raises(shardsmith.UsageError, match="no format named 'nope'"):
            registry.get("format", "nope")
        res = run_cli("plugins")
        assert res.exit_code == 0 and "source     fancy" in res.output
    finally:
        registry._installed.cache_clear()
