"""The gather in ranges: one rollover rule for writers and plans, and ranks that each write a range of shards."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli, run_subprocess, tree_digest, two_file_corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.kit.rollover import Rollover, runs, shard_bounds

# many processes a test (DataLoader workers, killed ranks, an S3 server, a browser) or long: `make test-heavy`
pytestmark = pytest.mark.heavy

# -- the rule -----------------------------------------------------------------------------------------


def reference_bounds(weights: list[int], max_weight: int, max_samples: int | None) -> list[int]:
    """The rule written the obvious way, one sample at a time."""
    bounds, count, total = [0], 0, 0
    for i, w in enumerate(weights):
        full = max_samples is not None and count >= max_samples
        if count and (full or total + w > max_weight):
            bounds.append(i)
            count, total = 0, 0
        count += 1
        total += w
    if weights:
        bounds.append(len(weights))
    return bounds


weights_st = st.lists(st.integers(min_value=0, max_value=50), max_size=300)


@settings(max_examples=200, deadline=None)
@given(weights=weights_st, max_weight=st.integers(min_value=-5, max_value=200),
       max_samples=st.one_of(st.none(), st.integers(min_value=1, max_value=20)), cuts=st.lists(st.integers(0, 300)))
def test_rollover_matches_the_rule_for_any_batching(weights, max_weight, max_samples, cuts):
    want = reference_bounds(weights, max_weight, max_samples)
    assert shard_bounds(np.asarray(weights, dtype=np.int64), max_weight=max_weight,
                        max_samples=max_samples).tolist() == want
    roller = Rollover(max_weight=max_weight, max_samples=max_samples)
    edges = sorted({0, len(weights), *(c for c in cuts if c <= len(weights))})
    got = [0]
    for a, b in zip(edges[:-1], edges[1:]):
        got += [a + c for c in roller.cut(np.asarray(weights[a:b], dtype=np.int64))]
    if weights:
        got.append(len(weights))
    assert got == want
    # the gather's plan: a batch that fits whole is taken by its sum (``takes_whole``), the others cut
    roller = Rollover(max_weight=max_weight, max_samples=max_samples)
    got = [0]
    for a, b in zip(edges[:-1], edges[1:]):
        if not roller.takes_whole(sum(weights[a:b]), b - a):
            got += [a + c for c in roller.cut(np.asarray(weights[a:b], dtype=np.int64))]
    if weights:
        got.append(len(weights))
    assert got == want


@settings(max_examples=100, deadline=None)
@given(weights=weights_st, max_weight=st.integers(min_value=1, max_value=200),
       max_samples=st.one_of(st.none(), st.integers(min_value=1, max_value=20)), pick=st.integers(0, 1000))
def test_a_writer_starting_at_a_planned_boundary_cuts_the_same_shards(weights, max_weight, max_samples, pick):
    """What lets ranks write ranges: from any boundary on, the rule finds the same boundaries."""
    bounds = reference_bounds(weights, max_weight, max_samples)
    start = bounds[pick % len(bounds)]
    rest = shard_bounds(np.asarray(weights[start:], dtype=np.int64), max_weight=max_weight, max_samples=max_samples)
    assert [start + b for b in rest.tolist()][:-1] == [b for b in bounds if b >= start][:-1] or start == len(weights)


def test_runs_mark_the_shard_starts():
    assert runs([], 5) == [(0, 5, False)]
    assert runs([0, 3], 5) == [(0, 3, True), (3, 5, True)]
    assert runs([2], 2) == [(0, 2, False)]
    assert runs([2], 4) == [(0, 2, False), (2, 4, True)]


# -- ranks, as a user runs them --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_file_corpus(tmp_path_factory.mktemp("gather-corpus"), 1500, seed=21, max_words=40, first=700)


def _args(corpus: Path, tokenizer: Path, out: Path, shard_tokens: str = "8K") -> list[str | Path]:
    return ["pack-tokens", corpus, "--tokenizer", tokenizer, "--memory", "256KB", "--shard-tokens", shard_tokens,
            "--nanogpt", "--workers", "1", "-q", "-o", out]


def _stage(args: list[str | Path], stage: str, rank: int, world: int, **env: str):
    return run_subprocess(*args, "--stage", stage, "--rank", str(rank), "--world-size", str(world),
                          env={**os.environ, **env} if env else None)


def test_a_gather_rank_killed_is_rerun_alone(corpus, bpe_tokenizer, tmp_path):
    one = tmp_path / "one"
    assert run_cli(*_args(corpus, bpe_tokenizer, one)).exit_code == 0
    out = tmp_path / "staged"
    args = _args(corpus, bpe_tokenizer, out)
    for rank in range(3):
        assert _stage(args, "scatter", rank, 3).returncode == 0
    assert _stage(args, "plan", 0, 3).returncode == 0
    assert _stage(args, "gather", 0, 3).returncode == 0
    killed = _stage(args, "gather", 1, 3, SHARDSMITH_CRASH_AT="gather:train:0")
    assert killed.returncode == -9
    assert _stage(args, "gather", 2, 3).returncode == 0
    early = _stage(args, "finalize", 0, 3)
    assert early.returncode == 2 and "are not written" in early.stderr and "Traceback" not in early.stderr
    a, b, shards = map(int, re.search(r"shards (\d+)\.\.(\d+) of (\d+) are not written", early.stderr).groups())
    assert (a, b + 1) == (shards // 3, 2 * shards // 3), early.stderr  # exactly rank 1's range
    assert not (out / "manifest.json").exists()

    before = {p.name: p.stat().st_mtime_ns for p in out.glob("train-*")}
    again = _stage(args, "gather", 0, 3)  # a finished rank rerun finds its piece and does nothing
    assert again.returncode == 0, again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("train-*")} == before
    assert _stage(args, "gather", 1, 3).returncode == 0
    done = _stage(args, "finalize", 0, 3)
    assert done.returncode == 0, done.stderr
    assert tree_digest(out) == tree_digest(one)  # the killed rank's temporary files are gone too
    assert not list(out.glob(".*"))


def test_finalize_checks_the_shards_and_a_rank_rerun_repairs_them(corpus, bpe_tokenizer, tmp_path):
    out = tmp_path / "staged"
    args = _args(corpus, bpe_tokenizer, out)
    for stage in ("scatter", "plan", "gather"):  # (plan rank 1: nothing to do)
        for rank in range(2):
            res = run_cli(*args, "--stage", stage, "--rank", str(rank), "--world-size", "2")
            assert res.exit_code == 0, res.stderr
    shards = sorted(out.glob("train-*.bin"))
    assert len(shards) >= 4
    shards[-1].unlink()
    res = run_cli(*args, "--stage", "finalize", "--world-size", "2")
    assert res.exit_code == 1 and "missing or changed" in res.stderr, res.stderr
    res = run_cli(*args, "--stage", "gather", "--rank", "1", "--world-size", "2")
    assert res.exit_code == 0, res.stderr
    res = run_cli(*args, "--stage", "finalize", "--world-size", "2")
    assert res.exit_code == 0, res.stderr
    one = tmp_path / "one"
    assert run_cli(*_args(corpus, bpe_tokenizer, one)).exit_code == 0
    assert tree_digest(out) == tree_digest(one)


def test_more_ranks_than_shards(corpus, bpe_tokenizer, tmp_path):
    out = tmp_path / "staged"
    args = _args(corpus, bpe_tokenizer, out, shard_tokens="1M")
    for rank in range(3):
        assert run_cli(*args, "--stage", "scatter", "--rank", str(rank), "--world-size", "3").exit_code == 0
    assert run_cli(*args, "--stage", "plan", "--world-size", "3").exit_code == 0
    said = []
    for rank in range(3):
        res = run_cli(*args, "--stage", "gather", "--rank", str(rank), "--world-size", "3")
        assert res.exit_code == 0, res.stderr
        said.append(res.output)
    assert "wrote train" in said[0] and "no shard" in said[2], said
    res = run_cli(*args, "--stage", "finalize", "--rank", "1", "--world-size", "3")
    assert res.exit_code == 0 and "nothing to do" in res.output
    assert run_cli(*args, "--stage", "finalize", "--world-size", "3").exit_code == 0
    assert len(list(out.glob("train-*.bin"))) == 1


def test_a_finalize_killed_before_the_manifest_is_rerun(corpus, bpe_tokenizer, tmp_path):
    out = tmp_path / "staged"
    args = _args(corpus, bpe_tokenizer, out)
    for stage in ("scatter", "plan", "gather"):  # (plan rank 1: nothing to do)
        for rank in range(2):
            assert _stage(args, stage, rank, 2).returncode == 0
    killed = _stage(args, "finalize", 0, 2, SHARDSMITH_CRASH_AT="manifest")
    assert killed.returncode == -9 and (out / "train.bin").is_file() and not (out / "manifest.json").exists()
    again = _stage(args, "finalize", 0, 2)  # the nanoGPT file was already moved into place
    assert again.returncode == 0, again.stderr
    one = tmp_path / "one"
    assert run_cli(*_args(corpus, bpe_tokenizer, one)).exit_code == 0
    assert tree_digest(out) == tree_digest(one)


def test_event_tar_weights_are_the_samples_tar_bytes():
    """The plan cuts one-event tar samples by these weights; the tar writer by the real bytes."""
    from shardsmith.core.events import EventChunk, EventSchema, Field, encode
    from shardsmith.formats.event_tar.writer import EventTarWriter
    from shardsmith.formats.webdataset.tarfmt import sample_members

    schema = EventSchema(fields=[
        Field(name="e", dtype="<f8"), Field(name="pos", dtype="<f4", shape=(3,)),
        Field(name="t", dtype="<f4", counter="n"), Field(name="xy", dtype="<i2", shape=(2,), counter="n"),
        Field(name="j", dtype="<f4", counter="m")])
    rng = np.random.default_rng(0)
    n = 300
    cn, cm = rng.integers(0, 2000, n), rng.integers(0, 12, n)
    cn[:5] = [0, 1, 9, 10, 1000]  # every digit count of the .npy shape

    def offsets(c: np.ndarray) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(c)]).astype(np.int64)

    chunk = EventChunk(first=0, n=n, offsets={"n": offsets(cn), "m": offsets(cm)}, columns={
        "e": rng.random(n), "pos": rng.random((n, 3)).astype("f4"), "t": rng.random(cn.sum()).astype("f4"),
        "xy": rng.integers(0, 9, (cn.sum(), 2)).astype("i2"), "j": rng.random(cm.sum()).astype("f4")})
    lengths, payload = encode(chunk, schema)
    writer = EventTarWriter(out_dir=Path("unused"), split="x", schema=schema, shard_samples=None, shard_bytes=1 << 30)
    real = [sum(len(m) for m in sample_members(f"e{i:010d}", writer._sample(chunk, i, i + 1))) for i in range(n)]
    assert writer.weights(lengths, memoryview(payload)).tolist() == real


@pytest.mark.parametrize("world_size", [2, 3])
def test_events_in_tar_are_gathered_in_ranges(tmp_path, world_size):
    from conftest import run_cli as cli
    from test_stages import one_process, staged

    from shardsmith.demo.icecube_like import make_icecube_kaggle_like

    batches, meta = make_icecube_kaggle_like(tmp_path / "ic", batches=2, events_per_batch=150, mean_pulses=20,
                                             seed=3, row_group_rows=1500)
    args = ["convert", *batches, "--group-by", "event_id", "--events-table", meta, "--to", "webdataset",
            "--memory", "128KB", "--shard-bytes", "60KB", "-q"]
    one_process([*args, "--workers", "1"], tmp_path / "one")
    staged(args, tmp_path / "staged", world_size)
    assert len(list((tmp_path / "one").glob("train-*.tar"))) >= 4
    assert tree_digest(tmp_path / "staged") == tree_digest(tmp_path / "one")
    splits = [json.loads((tmp_path / d / "manifest.json").read_text())["splits"] for d in ("one", "staged")]
    assert splits[0] == splits[1] and splits[0]["train"]["events"] == 300
    res = cli(*args, "-o", tmp_path / "two", "--workers", "2")  # gather workers, each a range of shards
    assert res.exit_code == 0, res.stderr
    assert tree_digest(tmp_path / "two") == tree_digest(tmp_path / "one")


def test_ranks_rerun_with_another_world_size_still_finalize(corpus, bpe_tokenizer, tmp_path):
    """Pieces of W=2 and W=3 gathers overlap; finalize finds a cover through them."""
    out = tmp_path / "staged"
    args = _args(corpus, bpe_tokenizer, out, shard_tokens="4K")
    for rank in range(2):
        assert run_cli(*args, "--stage", "scatter", "--rank", str(rank), "--world-size", "2").exit_code == 0
    assert run_cli(*args, "--stage", "plan", "--world-size", "2").exit_code == 0  # (its plan serves any W)
    assert run_cli(*args, "--stage", "gather", "--rank", "0", "--world-size", "2").exit_code == 0
    for rank in range(3):
        assert run_cli(*args, "--stage", "gather", "--rank", str(rank), "--world-size", "3").exit_code == 0
    res = run_cli(*args, "--stage", "finalize")
    assert res.exit_code == 0, res.stderr
    one = tmp_path / "one"
    assert run_cli(*_args(corpus, bpe_tokenizer, one, shard_tokens="4K")).exit_code == 0
    assert tree_digest(out) == tree_digest(one)


def test_a_rerun_with_other_workers_after_a_kill_keeps_the_nanogpt_file(corpus, bpe_tokenizer, tmp_path):
    """A killed one-writer run leaves a piece whose nanoGPT file the rerun removes: it is not reused."""
    out = tmp_path / "out"
    args = [*_args(corpus, bpe_tokenizer, out)]
    killed = run_subprocess(*args, env={**os.environ, "SHARDSMITH_CRASH_AT": "manifest"})
    assert killed.returncode == -9
    args[args.index("--workers") + 1] = "2"
    again = run_subprocess(*args)
    assert again.returncode == 0, again.stderr
    assert run_cli("verify", out).exit_code == 0
    one = tmp_path / "one"
    assert run_cli(*_args(corpus, bpe_tokenizer, one)).exit_code == 0
    assert tree_digest(out) == tree_digest(one)


def test_stages_never_touch_a_finished_dataset(corpus, bpe_tokenizer, tmp_path):
    out = tmp_path / "done"
    assert run_cli(*_args(corpus, bpe_tokenizer, out)).exit_code == 0
    before = tree_digest(out, skip=())
    other = tmp_path / "other.json"
    other.write_bytes(bpe_tokenizer.read_bytes().replace(b'"<|endoftext|>"', b'"<|endoftext|>"', 1) + b" ")
    args = [*_args(corpus, other, out)]
    assert run_cli(*args, "--stage", "scatter").exit_code == 0
    res = run_cli(*args, "--stage", "gather")
    assert res.exit_code == 2 and "already holds a finished dataset" in res.stderr
    assert tree_digest(out, skip=()) == before


def test_an_empty_split_of_images_gets_its_wids_index(tmp_path):
    from conftest import jpeg_folder

    root = jpeg_folder(tmp_path / "imgs", classes=2, per_class=3)
    res = run_cli("convert", root, "--to", "webdataset", "-o", tmp_path / "out", "--split", "train=0.999,test=0.001",
                  "-q")
    assert res.exit_code == 0, res.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["splits"]["test"]["samples"] == 0
    assert json.loads((tmp_path / "out" / "__index__" / "test.wids.json").read_text())["shardlist"] == []
