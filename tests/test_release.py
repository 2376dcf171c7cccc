"""The gather gives the spill back as it goes (engine/shuffle/release.py, issue 31): the part files' bytes
that only finished shards read are punched out, each finished shard is recorded on its own, and a
gather killed after punching resumes after its finished shards with the bytes of an uninterrupted
run (guarantee 4), with the same or another number of workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_subprocess, tree_digest

from shardsmith.demo.root_files import make_icecube_like
from shardsmith.engine.shuffle import release
from shardsmith.engine.shuffle.release import group_ranges, punch
from shardsmith.engine.shuffle.segments import Segments

pytestmark = pytest.mark.skipif(not release.supported(), reason="no hole punching here (Linux only)")


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 6 MB of events once decoded: a dozen tasks at --memory 8MB, groups of ~700 KB."""
    return make_icecube_like(tmp_path_factory.mktemp("release") / "ice.root", events=6_000, mean_pulses=40,
                             seed=4, events_per_basket=500)


def _args(src: Path, out: Path, workers: int, to: str = "hdf5") -> list[str | Path]:
    return ["convert", src, "-o", out, "--to", to, "--memory", "8MB", "--workers", str(workers),
            "--shard-samples", "700", "-q"]


def _unreleased(args: list[str | Path]) -> dict[str, str]:
    """The bytes ``args`` make with nothing given back (with one worker: one writer, unplanned)."""
    out = Path(args[args.index("-o") + 1])
    code = ("import sys; from shardsmith.engine.shuffle import release; release.ENABLED = False; "
            "from shardsmith.cli import main; sys.argv[0] = 'shardsmith'; main()")
    res = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert not (out.parent / f".{out.name}.shardsmith-work").exists()
    return tree_digest(out)


@pytest.fixture(scope="module")
def events_refs(events, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    root = tmp_path_factory.mktemp("events-refs")
    return {to: _unreleased(_args(events, root / to, 1, to)) for to in ("hdf5", "webdataset")}


def _holes(work: Path) -> int:
    """Bytes of the part files no longer on the disk (allocated less than their size)."""
    return sum(max(0, p.stat().st_size - p.stat().st_blocks * 512) for p in work.glob("part-*.bin"))


def _killed(args: list[str | Path], point: str, *, in_worker: bool = True) -> None:
    """The run killed at ``point``: in a gather worker, which takes the run down with it, or (not
    ``in_worker``: one gather worker is the run itself) in the run."""
    env = {**os.environ, "SHARDSMITH_CRASH_AT": point, **({"SHARDSMITH_CRASH_PARENT": "1"} if in_worker else {})}
    res = run_subprocess(*args, env=env)
    assert res.returncode == -signal.SIGKILL, (point, res.returncode, res.stderr)


@pytest.mark.parametrize(("to", "workers", "rerun_workers"), [
    ("hdf5", 2, 2), ("hdf5", 2, 1), ("hdf5", 2, 3), ("hdf5", 1, 2), ("webdataset", 2, 1), ("webdataset", 1, 3)])
def test_a_gather_killed_after_releasing_resumes_to_the_same_bytes(events, events_refs, tmp_path, to, workers,
                                                                   rerun_workers):
    """HDF5 and event tars (one writer or the first of two ranges) record shards 0 and 1, punch the
    spill only they read, and the rerun writes the rest: the bytes of a run that gives nothing back."""
    out = tmp_path / "out"
    _killed(_args(events, out, workers, to), "released:train:1", in_worker=workers > 1)
    work = tmp_path / ".out.shardsmith-work"
    assert (work / "released-train").is_file() and (work / "piece-train-000001-000002.json").is_file()
    assert _holes(work) > 500_000, "the groups shards 0 and 1 alone read are punched out"
    # the rerun starts after them: were shard 1 written again, this crash point would kill it too
    res = run_subprocess(*_args(events, out, rerun_workers, to),
                         env={**os.environ, "SHARDSMITH_CRASH_AT": "released:train:1"})
    assert res.returncode == 0, res.stderr
    assert tree_digest(out) == events_refs[to]
    assert not work.exists()


@pytest.mark.parametrize(("workers", "overwrite"), [(1, False), (2, False), (2, True)])
def test_a_finished_shard_removed_after_releasing_makes_the_rerun_start_afresh(events, events_refs, tmp_path,
                                                                              workers, overwrite):
    """A shard a killed run recorded is removed (by hand, by the rerun's own --overwrite, or a staging
    folder cleared): the spill it was made from is given back, so the rerun reads the inputs again
    rather than punched bytes."""
    out = tmp_path / "out"
    _killed(_args(events, out, workers), "released:train:1", in_worker=workers > 1)
    if not overwrite:
        (out / "train-000000.h5").unlink()
    res = run_subprocess(*_args(events, out, workers), *(["--overwrite"] if overwrite else []))
    assert res.returncode == 0, res.stderr
    assert tree_digest(out) == events_refs["hdf5"]


def test_a_gather_rank_whose_released_shard_was_removed_refuses_in_one_line(events, tmp_path):
    """Cluster stages share the scratch folder, so it is never started afresh under the ranks: the
    rank that would write a removed shard from given-back spill stops in one line (exit 2); the
    other rank, whose shards are whole, is not held up by it."""
    out, args = tmp_path / "out", _args(events, tmp_path / "out", 1)[1:]
    args = [a for a in args if a != "-o" and a != out]
    stage = ["convert", *args, "-o", out, "--world-size", "2"]
    for rank in ("0", "1"):
        assert run_subprocess(*stage, "--stage", "scatter", "--rank", rank).returncode == 0
    assert run_subprocess(*stage, "--stage", "plan").returncode == 0
    _killed([*stage, "--stage", "gather", "--rank", "0"], "released:train:1", in_worker=False)
    (out / "train-000000.h5").unlink()
    res = run_subprocess(*stage, "--stage", "gather", "--rank", "0")
    assert res.returncode == 2 and "start the stages over" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = run_subprocess(*stage, "--stage", "gather", "--rank", "1")
    assert res.returncode == 0, res.stderr


def test_an_uninterrupted_run_releases_all_but_the_shared_groups(events, tmp_path):
    out = tmp_path / "out"
    res = run_subprocess(*_args(events, out, 2), env={**os.environ, "SHARDSMITH_CRASH_AT": "manifest"})
    assert res.returncode == -signal.SIGKILL
    work = tmp_path / ".out.shardsmith-work"
    parts = sum(p.stat().st_size for p in work.glob("part-*.bin"))
    assert _holes(work) > 0.6 * parts, (_holes(work), parts)


def test_punch_keeps_the_blocks_it_only_partly_covers(tmp_path):
    path = tmp_path / "f"
    data = bytes(range(256)) * (64 * 1024 // 256)
    path.write_bytes(data)
    assert punch(str(path), [(100, 9000), (8192 + 1, 8192 + 4096 * 3 - 1)]) == 4096 + 4096
    got = path.read_bytes()
    assert len(got) == len(data)
    assert got[:4096] == data[:4096] and got[4096:8192] == bytes(4096)  # the one whole block in (100, 9000)
    assert got[8192:12288] == data[8192:12288] and got[12288:16384] == bytes(4096)
    assert got[16384:] == data[16384:]


def test_group_ranges_merge_adjacent_segments():
    segs = Segments.of([("a", 0, 2, 100), ("b", 10, 1, 5), ("a", 148, 1, 10), ("a", 500, 0, 0)])
    assert group_ranges(segs) == {"a": [(0, 182)], "b": [(10, 39)]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 2 MB of JSONL: ten tasks at --memory 2MB, several shards of 100K tokens."""
    from conftest import two_file_corpus

    return two_file_corpus(tmp_path_factory.mktemp("release-text"), 12_000, seed=5, max_words=60, first=7000)


def _pack(src: Path, out: Path, tokenizer: Path, workers: int) -> list[str | Path]:
    return ["pack-tokens", src, "-o", out, "--tokenizer", tokenizer, "--memory", "2MB", "--workers", str(workers),
            "--shard-tokens", "100K", "--split", "train=0.9,val=0.1", "-q"]


@pytest.fixture(scope="module")
def unreleased(corpus, bpe_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _unreleased(_pack(corpus, tmp_path_factory.mktemp("unreleased") / "ref", bpe_tokenizer, 1))


@pytest.mark.parametrize(("workers", "rerun_workers"), [(2, 2), (2, 1), (2, 3), (1, 1), (1, 2), (1, 3)])
def test_pack_tokens_releases_its_spill_and_resumes_after_a_kill(corpus, bpe_tokenizer, unreleased, tmp_path,
                                                                 workers, rerun_workers):
    """Token shards are recorded one by one too, with one gather worker or several: their spill is
    punched, and a killed gather resumes to the bytes of a writer that gives nothing back."""
    out = tmp_path / "out"
    # shards 0 to 4 finished: the first range's (2 workers) or the one writer's; a part's released spans
    # are punched once they make an eighth of it (``release.PUNCHES_PER_PART``)
    _killed(_pack(corpus, out, bpe_tokenizer, workers), "released:train:4", in_worker=workers > 1)
    work = tmp_path / ".out.shardsmith-work"
    assert (work / "released-train").is_file() and (work / "piece-train-000004-000005.json").is_file()
    assert _holes(work) > 32_768, "the groups token shards 0 to 4 alone read are punched out"
    if workers == 1:  # shard 4 was recorded as soon as its last sample was in, before shard 5 had any
        assert not list(out.glob(".train-000005.*")), sorted(p.name for p in out.iterdir())
    res = run_subprocess(*_pack(corpus, out, bpe_tokenizer, rerun_workers),
                         env={**os.environ, "SHARDSMITH_CRASH_AT": "released:train:4"})
    assert res.returncode == 0, res.stderr
    assert tree_digest(out) == unreleased
    assert not work.exists()


def test_one_gather_worker_gives_back_all_its_spill(corpus, bpe_tokenizer, unreleased, tmp_path):
    """One writer, one range: every group is punched once its shards are whole (none is shared
    between ranges); what stays is the single-shard val split's (one unplanned writer) and the
    blocks that segments share with their neighbours."""
    out = tmp_path / "out"
    res = run_subprocess(*_pack(corpus, out, bpe_tokenizer, 1), env={**os.environ, "SHARDSMITH_CRASH_AT": "manifest"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    work = tmp_path / ".out.shardsmith-work"
    parts = sum(p.stat().st_size for p in work.glob("part-*.bin"))
    assert _holes(work) > 0.7 * parts, (_holes(work), parts)
    assert run_subprocess(*_pack(corpus, out, bpe_tokenizer, 1)).returncode == 0
    assert tree_digest(out) == unreleased


def test_nanogpt_keeps_one_unplanned_writer(corpus, bpe_tokenizer, tmp_path):
    """--nanogpt's train.bin is hashed as one writer writes it: with one worker, nothing is planned or punched."""
    out = tmp_path / "out"
    res = run_subprocess(*_pack(corpus, out, bpe_tokenizer, 1), "--nanogpt",
                         env={**os.environ, "SHARDSMITH_CRASH_AT": "manifest"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    work = tmp_path / ".out.shardsmith-work"
    assert _holes(work) == 0 and not list(work.glob("plan-*.json")) and not (work / "released-train").exists()

