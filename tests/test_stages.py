"""Cluster stages: scatter on W ranks, then gather; the shards are those of a one-process run for any W."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import jpeg_folder, run_cli, run_subprocess, tree_digest, two_file_corpus

from shardsmith.demo.icecube_like import make_icecube_kaggle_like

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_file_corpus(tmp_path_factory.mktemp("stage-corpus"), 2500, seed=11, max_words=40, first=1200)


def staged(args: list[str | Path], out: Path, world_size: int) -> None:
    """Every scatter rank (one of them twice: a rank rerun is harmless), the plan (twice: the same),
    the gather on every rank, then finalize."""
    for rank in [*range(world_size), world_size - 1]:
        res = run_cli(*args, "-o", out, "--stage", "scatter", "--rank", str(rank), "--world-size", str(world_size))
        assert res.exit_code == 0, res.stderr
        assert f"scatter rank {rank} of {world_size}" in res.output
    for said in ("segment", "already planned"):
        res = run_cli(*args, "-o", out, "--stage", "plan", "--world-size", str(world_size))
        assert res.exit_code == 0, res.stderr
        assert f"plan rank 0 of {world_size}: planned" in res.output and said in res.output, res.output
    for rank in reversed(range(world_size)):  # each rank writes its range of the shards
        res = run_cli(*args, "-o", out, "--stage", "gather", "--rank", str(rank), "--world-size", str(world_size))
        assert res.exit_code == 0, res.stderr
        assert f"gather rank {rank} of {world_size}: wrote" in res.output
        assert not (out / "manifest.json").exists()
    res = run_cli(*args, "-o", out, "--stage", "finalize", "--world-size", str(world_size))
    assert res.exit_code == 0, res.stderr
    assert (out / "manifest.json").is_file()
    assert not (out.parent / f".{out.name}.shardsmith-work").exists()


def one_process(args: list[str | Path], out: Path) -> None:
    res = run_cli(*args, "-o", out)
    assert res.exit_code == 0, res.stderr


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_tokens_are_identical_for_any_world_size(texts, bpe_tokenizer, tmp_path, world_size):
    args = ["pack-tokens", texts, "--tokenizer", bpe_tokenizer, "--memory", "256KB", "--split",
            "train=0.9,val=0.1", "--shard-tokens", "15K", "--nanogpt", "-q"]
    one_process(args, tmp_path / "one")
    staged(args, tmp_path / "staged", world_size)
    assert tree_digest(tmp_path / "staged") == tree_digest(tmp_path / "one")


@pytest.mark.parametrize("world_size", [2, 3])
def test_tar_and_hdf5_are_identical_for_any_world_size(texts, tmp_path, world_size):
    args = ["convert", texts, "--to", "webdataset", "--text-field", "text", "--memory", "256KB",
            "--shard-samples", "400", "-q"]
    one_process(args, tmp_path / "tar-one")
    staged(args, tmp_path / "tar-staged", world_size)
    assert tree_digest(tmp_path / "tar-staged") == tree_digest(tmp_path / "tar-one")

    batches, meta = make_icecube_kaggle_like(tmp_path / "ic", batches=2, events_per_batch=150, mean_pulses=20,
                                             seed=2, row_group_rows=1500)
    args = ["convert", *batches, "--group-by", "event_id", "--events-table", meta, "--to", "hdf5",
            "--memory", "128KB", "--shard-samples", "100", "-q"]
    one_process(args, tmp_path / "h5-one")
    staged(args, tmp_path / "h5-staged", world_size)
    assert tree_digest(tmp_path / "h5-staged") == tree_digest(tmp_path / "h5-one")


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_lance_is_identical_for_any_world_size(texts, tmp_path):
    """The ranks write their ranges of data files; the finalize commits each split's table over all of them."""
    pytest.importorskip("lance", reason="--to lance needs pylance")
    args = ["convert", texts, "--to", "lance", "--text-field", "text", "--memory", "256KB", "--shard-samples", "400",
            "--split", "train=0.9,val=0.1", "-q"]
    one_process(args, tmp_path / "one")
    staged(args, tmp_path / "staged", 3)
    assert tree_digest(tmp_path / "staged") == tree_digest(tmp_path / "one")

    batches, meta = make_icecube_kaggle_like(tmp_path / "ic", batches=2, events_per_batch=150, mean_pulses=20,
                                             seed=2, row_group_rows=1500)  # events into Lance: a row an event
    args = ["convert", *batches, "--group-by", "event_id", "--events-table", meta, "--to", "lance",
            "--memory", "128KB", "--shard-samples", "100", "-q"]
    one_process(args, tmp_path / "ev-one")
    staged(args, tmp_path / "ev-staged", 2)
    assert tree_digest(tmp_path / "ev-staged") == tree_digest(tmp_path / "ev-one")


def test_images_staged_match_the_one_process_run(tmp_path):
    root = jpeg_folder(tmp_path / "imgs", classes=2, per_class=9)
    args = ["convert", root, "--to", "webdataset", "--shard-samples", "4", "--memory", "64KB", "-q"]
    one_process(args, tmp_path / "one")  # planned from the listing, no scatter
    staged(args, tmp_path / "staged", 2)  # the keyed shuffle across ranks
    assert tree_digest(tmp_path / "staged") == tree_digest(tmp_path / "one")


def test_gather_waits_for_every_rank_and_parts_of_another_run_are_refused(texts, bpe_tokenizer, tmp_path):
    args = ["pack-tokens", texts, "--tokenizer", bpe_tokenizer, "--memory", "256KB", "-q"]
    out = tmp_path / "out"
    res = run_cli(*args, "-o", out, "--stage", "scatter", "--rank", "0", "--world-size", "3")
    assert res.exit_code == 0, res.stderr
    res = run_cli(*args, "-o", out, "--stage", "plan", "--world-size", "3")
    assert res.exit_code == 2 and "not finished" in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = run_cli(*args, "-o", out, "--stage", "gather", "--world-size", "3")
    assert res.exit_code == 2 and "run --stage plan first" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (out / "manifest.json").exists()
    res = run_cli(*args, "-o", out, "--stage", "scatter", "--seed", "9", "--rank", "1", "--world-size", "3")
    assert res.exit_code == 2 and "different run" in res.stderr, res.stderr
    res = run_cli(*args, "-o", out, "--stage", "scatter", "--rank", "3", "--world-size", "3")
    assert res.exit_code == 2 and "world size" in res.stderr


def test_rank_and_world_size_come_from_slurm(texts, bpe_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    res = run_cli("pack-tokens", texts, "--tokenizer", bpe_tokenizer, "-o", tmp_path / "o", "--stage", "scatter", "-q")
    assert res.exit_code == 0 and "scatter rank 1 of 2" in res.output, res.output


def test_a_trained_tokenizer_is_trained_once_for_every_stage(texts, tmp_path):
    args = ["pack-tokens", texts, "--train-tokenizer", "300", "--memory", "256KB", "--shard-tokens", "10K"]
    one_process([*args, "-q"], tmp_path / "one")
    out = tmp_path / "staged"
    said = ""
    for stage, ranks in (("scatter", 2), ("plan", 1), ("gather", 2), ("finalize", 1)):
        for rank in range(ranks):
            res = run_cli(*args, "-o", out, "--stage", stage, "--rank", str(rank), "--world-size", "2")
            assert res.exit_code == 0, res.stderr
            said += res.stderr
    assert said.count("training a byte-level BPE") == 1, said
    assert tree_digest(out) == tree_digest(tmp_path / "one")


def test_a_plan_unit_killed_half_way_is_run_again_and_only_this_runs_plan_is_read(texts, tmp_path):
    """The plan is written a split at a time and its index last: a plan unit killed between two
    splits leaves no plan a gather would read (it says to run the plan), and its rerun makes the
    one-process bytes; a plan is read only under this run's fingerprint."""
    args = ["convert", texts, "--to", "webdataset", "--text-field", "text", "--memory", "256KB",
            "--split", "train=0.8,val=0.2", "--shard-samples", "300", "-q"]
    one_process(args, tmp_path / "one")
    out = tmp_path / "staged"
    for rank in (0, 1):
        assert run_cli(*args, "-o", out, "--stage", "scatter", "--rank", str(rank), "--world-size", "2").exit_code == 0
    plan = [*args, "-o", out, "--stage", "plan", "--world-size", "2"]
    work = out.parent / f".{out.name}.shardsmith-work"
    killed = run_subprocess(*plan, env={**os.environ, "SHARDSMITH_CRASH_AT": "plan:tables"})
    assert killed.returncode == -9, killed.stderr
    assert list(work.glob("planning-*")) and not list(work.glob("planned-*"))  # its tables routed, none planned
    killed = run_subprocess(*plan, env={**os.environ, "SHARDSMITH_CRASH_AT": "plan:train"})
    assert killed.returncode == -9, killed.stderr
    assert list(work.glob("planned-*-train.bin")) and not list(work.glob("planned-*-val.bin"))
    res = run_cli(*args, "-o", out, "--stage", "gather", "--rank", "0", "--world-size", "2")
    assert res.exit_code == 2 and "run --stage plan first" in res.stderr and "Traceback" not in res.stderr
    assert run_cli(*plan).exit_code == 0
    assert not list(work.glob("planning-*"))  # the tables' folder gone once the plan is written
    index, = (p for p in work.glob("planned-*.json") if not p.name.endswith("-results.json"))
    index.rename(index.with_name("planned-0123456789ab-0123456789ab.json"))  # another run's name
    res = run_cli(*args, "-o", out, "--stage", "gather", "--rank", "0", "--world-size", "2")
    assert res.exit_code == 2 and "run --stage plan first" in res.stderr
    assert run_cli(*plan).exit_code == 0
    for stage, rank in (("gather", 1), ("gather", 0), ("finalize", 0)):
        res = run_cli(*args, "-o", out, "--stage", stage, "--rank", str(rank), "--world-size", "2")
        assert res.exit_code == 0, res.stderr
    assert tree_digest(out) == tree_digest(tmp_path / "one")
