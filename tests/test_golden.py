"""Golden outputs: a fixed set of commands on fixed inputs, and the sha256 of every file they write.

This guards the on-disk formats and shard bytes through refactors: every format and source,
augmentation, splits, nanoGPT files, compression, several workers and the cluster stages. The
inputs are committed files (``tests/golden/inputs``, plus the shared real ROOT files); the
expected digests are in ``tests/golden/expected.json``. Regenerate them only on purpose (a
deliberate format change), with ``SHARDSMITH_GOLDEN_WRITE=1 pytest tests/test_golden.py``.

Only ``manifest.json`` is left out of the comparison (it records the time it was made); its
listed files, samples and sha256s are compared instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import root_data, run_cli

GOLDEN = Path(__file__).parent / "golden"
INPUTS = GOLDEN / "inputs"
EXPECTED = GOLDEN / "expected.json"
ROOT_DATA = Path(os.environ.get("SHARDSMITH_ROOT_DATA") or Path(__file__).resolve().parents[2] / "shared/data/root")
IN = str(INPUTS)

# name -> list of commands (several for the cluster stages); "{out}" is the output folder
CASES: dict[str, list[list[str]]] = {
    "tokens-gigatoken-splits-nanogpt": [[
        "pack-tokens", f"{IN}/text", "--tokenizer", f"{IN}/tokenizer.json", "--split", "train=0.9,val=0.1",
        "--shard-tokens", "2000", "--seed", "3", "--workers", "2", "--nanogpt", "-o", "{out}"]],
    "tokens-hf-in-order": [[
        "pack-tokens", f"{IN}/text", "--tokenizer", f"{IN}/tokenizer.json", "--engine", "hf", "--no-shuffle",
        "--bos-token", "<|endoftext|>", "--workers", "1", "-o", "{out}"]],
    "tokens-trained": [[
        "pack-tokens", f"{IN}/text", "--train-tokenizer", "280", "--seed", "5", "--workers", "2", "-o", "{out}"]],
    "tokens-parquet": [[
        "pack-tokens", f"{IN}/rows.parquet", "--tokenizer", f"{IN}/tokenizer.json", "--workers", "1",
        "-o", "{out}"]],
    "images-direct-splits": [[
        "convert", f"{IN}/images", "--to", "webdataset", "--shard-samples", "7", "--split", "train=0.75,val=0.25",
        "--seed", "2", "--workers", "2", "-o", "{out}"]],
    "images-shuffled-skip": [[
        "convert", f"{IN}/images", "--to", "webdataset", "--check-images", "full", "--on-error", "skip",
        "--wids-md5", "--workers", "2", "-o", "{out}"]],
    "images-augment-copies": [[
        "convert", f"{IN}/images", "--to", "webdataset", "--augment", "random-resized-crop=32,hflip",
        "--copies", "2", "--quality", "85", "--seed", "4", "--workers", "2", "-o", "{out}"]],
    "jsonl-tar": [[
        "convert", f"{IN}/text", "--to", "webdataset", "--text-field", "text", "--shard-bytes", "20KB",
        "--split", "train=0.8,val=0.2", "--workers", "2", "-o", "{out}"]],
    "parquet-tar-limit": [[
        "convert", f"{IN}/rows.parquet", "--to", "webdataset", "--text-field", "text", "--limit", "30",
        "--workers", "1", "-o", "{out}"]],
    "parquet-events-hdf5-gzip": [[
        "convert", f"{IN}/hits.parquet", "--to", "hdf5", "--group-by", "event_id", "--events-table",
        f"{IN}/events_meta.parquet", "--compression", "gzip", "--shard-samples", "12", "--workers", "2",
        "-o", "{out}"]],
    "parquet-events-tar-packed": [[
        "convert", f"{IN}/hits.parquet", "--to", "webdataset", "--group-by", "event_id",
        "--events-per-sample", "4", "--no-shuffle", "-o", "{out}"]],
    "root-hdf5-gzip-splits": [[
        "convert", str(ROOT_DATA / "uproot-HZZ.root"), "--to", "hdf5", "--compression", "gzip",
        "--split", "train=0.9,val=0.1", "--shard-samples", "1000", "--step-size", "64KB", "--workers", "2",
        "-o", "{out}"]],
    "root-tar-branches": [[
        "convert", str(ROOT_DATA / "uproot-small-dy-withoffsets.root"), "--to", "webdataset",
        "--branches", "Jet_*,nJet", "--workers", "2", "-o", "{out}"]],
    "rntuple-hdf5": [[
        "convert", str(ROOT_DATA / "Run2012BC_DoubleMuParked_Muons_1000evts_rntuple_v1-0-0-0.root"),
        "--to", "hdf5", "--workers", "1", "-o", "{out}"]],
    "tokens-stages": [
        ["pack-tokens", f"{IN}/text", "--tokenizer", f"{IN}/tokenizer.json", "--shard-tokens", "1500",
         "--stage", stage, "--rank", str(rank), "--world-size", "2", "--workers", "1", "-o", "{out}"]
        for stage, ranks in (("scatter", (0, 1)), ("plan", (0,)), ("gather", (0, 1)), ("finalize", (0,))) for rank in ranks],
}


def _digests(out: Path) -> dict[str, str]:
    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix()
        if rel == "manifest.json" or rel.startswith("."):
            continue
        files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest = json.loads((out / "manifest.json").read_bytes())
    listed = {s["path"]: (s["samples"], s["bytes"], s["sha256"])
              for split in manifest["splits"].values() for s in split["shards"]}
    files["manifest.json:shards"] = hashlib.sha256(json.dumps(listed, sort_keys=True).encode()).hexdigest()
    files["manifest.json:schema"] = hashlib.sha256(json.dumps(manifest["schema"], sort_keys=True).encode()).hexdigest()
    return files


def test_golden_outputs(tmp_path: Path) -> None:
    root_data()  # skips, saying why, without the real ROOT files
    got: dict[str, dict[str, str]] = {}
    # no lzf case: h5py's LZF filter compresses with an uninitialised hash table, so its bytes vary
    # from run to run (the decoded content does not)
    for name, commands in CASES.items():
        out = tmp_path / name
        for cmd in commands:
            result = run_cli(*[c.replace("{out}", str(out)) for c in cmd])
            assert result.exit_code == 0, f"{name}: {' '.join(cmd)}\n{result.output}"
        got[name] = _digests(out)
        shutil.rmtree(out)
    if os.environ.get("SHARDSMITH_GOLDEN_WRITE") == "1":
        EXPECTED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip("golden digests written")
    expected = json.loads(EXPECTED.read_text())
    assert sorted(got) == sorted(expected)
    for name in CASES:
        assert got[name] == expected[name], f"{name}: the output bytes changed"
