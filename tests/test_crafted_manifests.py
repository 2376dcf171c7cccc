"""The loader, verify, inspect and bench trust nothing in a manifest: every key deleted or replaced
by a value of the wrong type, a non-numeric dtype, a symlink leading out of the folder, a
corrupted tokenizer or wids index. Each is a one-line DatasetError (or works), never a traceback
or a crash of the interpreter."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import jpeg_folder, root_data, run_cli, run_subprocess, two_file_corpus

import shardsmith
from shardsmith.errors import ShardsmithError

WRONG = [None, 1, -1, 2**70, "x", [], {}, True, 1.5]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("crafted")
    corpus = two_file_corpus(root / "text", 200, seed=1, max_words=20, first=120)
    images = jpeg_folder(root / "images", classes=2, per_class=3)
    made = {
        "tokens": ["pack-tokens", corpus, "--tokenizer", bpe_tokenizer, "--nanogpt", "--seq-len", "16",
                   "--split", "train=0.8,val=0.2"],
        "jsonl-tar": ["convert", corpus, "--to", "webdataset", "--text-field", "text"],
        "image-tar": ["convert", images, "--to", "webdataset"],
    }
    if (root_data() / "uproot-HZZ.root").is_file():
        made["hdf5"] = ["convert", root_data() / "uproot-HZZ.root", "--to", "hdf5", "--branches", "Jet_P*,NJet,MET_px"]
        made["event-tar"] = ["convert", root_data() / "uproot-HZZ.root", "--to", "webdataset", "--branches",
                             "Jet_P*,NJet", "--events-per-sample", "16"]
    out = {}
    for name, args in made.items():
        res = run_cli(*args[:2], "-o", root / name, *args[2:], "-q")
        assert res.exit_code == 0, (name, res.stderr)
        out[name] = root / name
    return out


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a JSON value (lists: their first item only; a schema: its first 4 fields)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        items = list(value.items())
        for k, v in items[:4] if prefix == ("schema",) else items:  # a schema's first fields stand for the rest
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list) and value:
        found += _paths(value[0], (*prefix, 0))
    return found


def _mutated(manifest: dict[str, Any], path: tuple, value: Any, *, delete: bool) -> dict[str, Any]:
    m = json.loads(json.dumps(manifest))
    node = m
    for k in path[:-1]:
        node = node[k]
    if delete:
        if isinstance(node, list):
            node.pop(path[-1])
        else:
            del node[path[-1]]
    else:
        node[path[-1]] = value
    return m


def _every_reader_copes(out: Path, *, slow: bool) -> None:
    """The loader and the CLI work or fail with one line; ``slow``: ``verify --deep`` and ``bench``
    too (they read every sample or run 0.1 s, so the fuzz gives them a sample of the mutations)."""
    try:
        ds = shardsmith.open(out, split="train")
        if len(ds):
            ds[0]
    except ShardsmithError:
        pass
    commands = [["verify", out], ["inspect", out], ["inspect", out, "--json"]]
    if slow:
        commands += [["verify", out, "--deep"], ["bench", out, "--seconds", "0.1"]]
    for args in commands:
        res = run_cli(*args)  # any exception but a user error fails the test here (catch_exceptions=False)
        assert res.exit_code in (0, 1, 2), (args, res.exit_code, res.stderr)
        assert len(res.stderr.strip().splitlines()) <= 1, res.stderr


@pytest.mark.parametrize("kind", ["tokens", "jsonl-tar", "image-tar", "hdf5", "event-tar"])
def test_every_manifest_key_deleted_or_of_the_wrong_type(datasets, tmp_path, kind):
    if kind not in datasets:
        pytest.skip(f"needs the real ROOT files in {root_data()}")
    out = tmp_path / "ds"
    shutil.copytree(datasets[kind], out)
    original = json.loads((out / "manifest.json").read_text())
    paths = _paths(original)
    assert len(paths) > 20
    variants = [(True, None), *((False, v) for v in WRONG)]
    for p, path in enumerate(paths):
        for v, (delete, value) in enumerate(variants):
            (out / "manifest.json").write_text(json.dumps(_mutated(original, path, value, delete=delete)))
            # the slow commands on 1 of the 10 variants of each path, rotating so every variant is
            # met across the paths (> 20 of them; all variants: 45 s; this: a tenth)
            _every_reader_copes(out, slow=(v - p) % len(variants) == 0)
    (out / "manifest.json").write_text(json.dumps(original))
    res = run_cli("verify", out, "--deep")
    assert res.exit_code == 0, res.stderr


def test_bench_copes_with_a_crafted_tokens_manifest(datasets, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(datasets["tokens"], out)
    original = json.loads((out / "manifest.json").read_text())
    for path in [("format",), ("seq_len",), ("tokenizer",), ("tokenizer", "dtype"), ("tokenizer", "vocab_size"),
                 ("splits", "train", "samples"), ("splits", "train", "shards", 0, "bytes")]:
        for value in WRONG:
            (out / "manifest.json").write_text(json.dumps(_mutated(original, path, value, delete=False)))
            res = run_cli("bench", out, "--seconds", "0.1")
            assert res.exit_code in (0, 1, 2), res.stderr


@pytest.mark.parametrize("dtype", ["O", "V8", "<U4", "M8", ">f4", "object", "i16", "f16", "c16"])
def test_a_dtype_that_is_not_a_number_is_refused_not_a_crash(datasets, tmp_path, dtype):
    out = tmp_path / "ds"
    shutil.copytree(datasets["tokens"], out)
    m = json.loads((out / "manifest.json").read_text())
    m["tokenizer"]["dtype"] = dtype
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardsmithError, match="tokenizer.dtype"):
        shardsmith.open(out, split="train")
    for args in (["verify", out, "--deep"], ["bench", out, "--seconds", "0.1"]):
        res = run_subprocess(*args)  # a memmap of objects crashed the interpreter (SIGSEGV)
        assert res.returncode == 1 or res.returncode == 2, (args, res.returncode, res.stderr)
        assert "tokenizer.dtype" in res.stdout + res.stderr and "Traceback" not in res.stderr
    if "hdf5" in datasets:
        out = tmp_path / "ev"
        shutil.copytree(datasets["hdf5"], out)
        m = json.loads((out / "manifest.json").read_text())
        m["schema"]["MET_px"]["dtype"] = dtype
        (out / "manifest.json").write_text(json.dumps(m))
        res = run_subprocess("verify", out, "--deep")
        assert res.returncode == 1 and "schema.MET_px.dtype" in res.stdout, (res.returncode, res.stdout)
    if "event-tar" in datasets:
        out = tmp_path / "et"
        shutil.copytree(datasets["event-tar"], out)
        m = json.loads((out / "manifest.json").read_text())
        m["schema"]["NJet"]["dtype"] = dtype
        (out / "manifest.json").write_text(json.dumps(m))
        res = run_subprocess("verify", out, "--deep")
        assert res.returncode == 1 and "schema.NJet.dtype" in res.stdout, (res.returncode, res.stdout)


@pytest.mark.parametrize("dtype", [">f4", "O", "<U4", "V8", "M8", "f16", "c16"])
def test_an_event_schema_read_from_a_file_takes_dtypes_from_the_allow_list(dtype):
    from shardsmith.core.events import EventSchema
    from shardsmith.errors import DatasetError

    assert EventSchema.from_json({"x": {"dtype": "<f4"}}).fields[0].np_dtype == np.dtype("<f4")
    with pytest.raises(DatasetError, match=r"schema\.x\.dtype"):
        EventSchema.from_json({"x": {"dtype": dtype}})


def test_token_ids_are_integers_and_the_format_version_is_not_a_bool(datasets, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(datasets["tokens"], out)
    original = json.loads((out / "manifest.json").read_text())
    for path, value, field in [(("tokenizer", "dtype"), "<f4", "tokenizer.dtype"), (("shardsmith",), True, "shardsmith")]:
        (out / "manifest.json").write_text(json.dumps(_mutated(original, path, value, delete=False)))
        with pytest.raises(ShardsmithError, match=field):
            shardsmith.open(out, split="train")
        res = run_cli("verify", out)
        assert res.exit_code == 1 and field in res.output, res.output


@pytest.mark.parametrize("kind, target", [("tokens", "manifest.json"), ("tokens", "shard"), ("tokens", "index"),
                                          ("tokens", "tokenizer.json"), ("image-tar", "shard"), ("image-tar", "index"),
                                          ("image-tar", "__index__/train.wids.json"), ("hdf5", "shard")])
def test_a_symlink_leading_out_of_the_folder_is_refused(datasets, tmp_path, kind, target):
    if kind not in datasets:
        pytest.skip(f"needs the real ROOT files in {root_data()}")
    out = tmp_path / "ds"
    shutil.copytree(datasets[kind], out)
    m = json.loads((out / "manifest.json").read_text())
    shard = m["splits"]["train"]["shards"][0]
    name = {"shard": shard["path"], "index": shard.get("index", {}).get("path")}.get(target, target)
    outside = tmp_path / "elsewhere" / Path(name).name
    outside.parent.mkdir()
    shutil.move(out / name, outside)
    os.symlink(outside, out / name)
    res = run_subprocess("verify", out)
    assert res.returncode == 1 and "outside the dataset folder" in res.stdout, res.stdout
    if target.endswith(".json") and target != "manifest.json":  # read by verify, not by the loaders
        assert len(shardsmith.open(out, split="train")[0]) > 1
    else:
        with pytest.raises(ShardsmithError, match="outside the dataset folder"):
            ds = shardsmith.open(out, split="train")
            ds[0]
    # inside the folder, a link is fine
    (out / name).unlink()
    shutil.move(outside, out / f"real-{Path(name).name}")
    os.symlink(out / f"real-{Path(name).name}", out / name)
    assert run_cli("verify", out).exit_code == 0
    assert len(shardsmith.open(out, split="train")[0]) > 1


@pytest.mark.parametrize("target", ["tokenizer.json", "__index__/train.wids.json"])
@pytest.mark.parametrize("legacy", [False, True, "unlisted"], ids=["files", "legacy manifest", "not in files"])
def test_verify_covers_the_tokenizer_and_wids_index(datasets, tmp_path, target, legacy):
    kind = "tokens" if target == "tokenizer.json" else "jsonl-tar"
    out = tmp_path / "ds"
    shutil.copytree(datasets[kind], out)
    m = json.loads((out / "manifest.json").read_text())
    assert target in [f["path"] for f in m["files"]]
    if legacy == "unlisted":  # a files list that leaves one out does not exempt it
        m["files"] = [f for f in m["files"] if f["path"] != target]
        (out / "manifest.json").write_text(json.dumps(m))
    elif legacy:  # written before 'files' was recorded
        del m["files"]
        (out / "manifest.json").write_text(json.dumps(m))
    assert run_cli("verify", out).exit_code == 0
    data = (out / target).read_bytes()
    if target.endswith("wids.json"):
        index = json.loads(data)
        index["shardlist"][0]["nsamples"] += 1
        (out / target).write_text(json.dumps(index))
    else:
        (out / target).write_bytes(data.replace(b"<|endoftext|>", b"<|endoftexT|>"))
    assert hashlib.sha256((out / target).read_bytes()).hexdigest() != hashlib.sha256(data).hexdigest()
    res = run_subprocess("verify", out)
    assert res.returncode == 1 and target in res.stdout and "Traceback" not in res.stderr, res.stdout
