"""Guarantee 2, as a user meets it: the same command on the same inputs gives byte-identical shards
whatever ``--workers`` and whatever ``PYTHONHASHSEED`` (each run a fresh process, so str hashes,
set orders and worker scheduling really differ between runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import make_docs, tree_digest, write_jsonl

from shardsmith.demo.icecube_like import make_icecube_kaggle_like

# (PYTHONHASHSEED, --workers): every hash seed and both worker counts appear, and the reference
# run (first) differs from each other run in at least one of them
RUNS = [("0", "1"), ("1", "2"), ("random", "2"), ("random", "1")]


def run_all(tmp_path: Path, *args: str | Path) -> list[Path]:
    """The command once per entry of RUNS (two processes at a time), each into its own folder."""
    outs, procs = [], []
    for seed, workers in RUNS:
        out = tmp_path / f"out-hash{seed}-w{workers}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        cmd = [sys.executable, "-m", "shardsmith", *map(str, args), "-o", str(out), "--workers", workers, "-q"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs.append(out)
        if len(procs) % 2 == 0 or len(procs) == len(RUNS):
            for p in procs[-2:]:
                _, err = p.communicate(timeout=300)
                assert p.returncode == 0, err
    return outs


def stable_manifest(out: Path) -> dict[str, Any]:
    """The manifest without what rightly differs between runs: the time, the command line and the run's
    identity (which names the output)."""
    m = json.loads((out / "manifest.json").read_text())
    m.pop("created")
    m.pop("command")
    m.pop("run", None)
    return m


def assert_identical(outs: list[Path], *, shard_glob: str) -> None:
    ref = tree_digest(outs[0])
    assert len(list(outs[0].glob(shard_glob))) >= 3, "enough shards to catch a reordering"
    for out in outs[1:]:
        assert tree_digest(out) == ref, f"{out.name} differs from {outs[0].name}"
        assert stable_manifest(out) == stable_manifest(outs[0]), out.name


def test_pack_tokens_is_byte_identical(tmp_path, bpe_tokenizer):
    for i, name in enumerate(["a.jsonl", "b/c.jsonl", "d.jsonl"]):
        write_jsonl(tmp_path / "in" / name, make_docs(250, seed=i))
    outs = run_all(tmp_path, "pack-tokens", tmp_path / "in", "--tokenizer", bpe_tokenizer, "--split",
                   "train=0.9,val=0.1", "--shard-tokens", "3000", "--memory", "256KB", "--nanogpt")
    assert_identical(outs, shard_glob="train-*.bin")
    assert json.loads((outs[0] / "manifest.json").read_text())["splits"]["val"]["samples"] > 0


def test_convert_jsonl_to_webdataset_is_byte_identical(tmp_path):
    for i, name in enumerate(["a.jsonl", "b/c.jsonl", "d.jsonl"]):
        write_jsonl(tmp_path / "in" / name, make_docs(250, seed=10 + i))
    outs = run_all(tmp_path, "convert", tmp_path / "in", "--to", "webdataset", "--text-field", "text",
                   "--split", "train=0.8,val=0.2", "--shard-bytes", "40KB", "--memory", "128KB")
    assert_identical(outs, shard_glob="train-*.tar")


def test_convert_parquet_events_to_hdf5_is_byte_identical(tmp_path):
    batches, meta = make_icecube_kaggle_like(tmp_path / "ic", batches=3, events_per_batch=200, mean_pulses=10,
                                             seed=11, row_group_rows=700)
    outs = run_all(tmp_path, "convert", *batches, "--to", "hdf5", "--group-by", "event_id", "--events-table", meta,
                   "--split", "train=0.8,val=0.2", "--shard-samples", "120", "--memory", "256KB",
                   "--step-size", "16KB")
    assert_identical(outs, shard_glob="train-*.h5")


def test_the_hash_seed_reaches_the_runs():
    """The runs above mean something only if PYTHONHASHSEED changes str hashes in the process."""
    code = "print(hash('shardsmith'))"
    seen = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True).stdout for seed, _ in RUNS}
    assert len(seen) == len(RUNS)
