"""A job and its units are plain picklable values, and any process runs a unit from the job and the
output folder alone (``engine.conduct.run_unit``): units run in fresh processes (spawned, sharing no
memory with this one) make the bytes of a one-process run."""

from __future__ import annotations

import multiprocessing
import pickle
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import tree_digest, two_file_corpus

from shardsmith.commands import convert, pack_tokens
from shardsmith.engine.conduct import run_job, run_unit
from shardsmith.engine.job import Job
from shardsmith.engine.units import (
    FinalizeUnit,
    GatherUnit,
    PlanUnit,
    PrepareUnit,
    ScatterUnit,
    phases,
    unit_of,
)


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_file_corpus(tmp_path_factory.mktemp("job-corpus"), 1500, seed=5, max_words=30, first=700)


def _in_fresh_processes(job: Job, world: int) -> None:
    """Every phase's units at once, each in a process of its own that is handed the pickled job and unit."""
    ctx = multiprocessing.get_context("spawn")
    for phase in phases(world):
        procs = [ctx.Process(target=run_unit, args=(job, unit)) for unit in phase]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        assert [p.exitcode for p in procs] == [0] * len(procs), phase


def test_a_job_and_its_units_pickle() -> None:
    opts = convert.ConvertOptions(inputs=("in",), out=Path("out"), to="hdf5", format_options={"shard_samples": 10}, quiet=True)
    job = convert.job_of(opts)
    assert pickle.loads(pickle.dumps(job)) == job
    assert (job.command, job.format, job.source, job.out) == ("convert", "hdf5", None, Path("out"))
    for phase in phases(3):
        for unit in phase:
            assert pickle.loads(pickle.dumps(unit)) == unit
            assert unit_of(job.for_unit(unit).opts) == unit
    assert [len(p) for p in phases(3)] == [1, 3, 1, 3, 1]  # prepare, scatter, plan, gather, finalize
    planning = job.for_unit(PlanUnit(world=4)).opts  # once, for the gather's world size
    assert (planning.stage, planning.rank, planning.world_size) == ("plan", 0, 4)
    assert unit_of(opts) is None  # no --stage: every unit, here
    staged = job.for_unit(GatherUnit(rank=1, world=3)).opts
    assert (staged.stage, staged.rank, staged.world_size) == ("gather", 1, 3)
    assert job.for_unit(ScatterUnit(rank=0, world=2)).opts.stage == "scatter"
    assert job.for_unit(FinalizeUnit()).opts.stage == "finalize"
    assert job.for_unit(PrepareUnit()).opts.stage == "prepare"


def test_units_in_fresh_processes_make_the_one_process_bytes(texts: Path, tmp_path: Path) -> None:
    opts = convert.ConvertOptions(inputs=(str(texts),), out=tmp_path / "one", to="webdataset", text_field="text",
                                  memory=256 << 10, format_options={"shard_samples": 300}, quiet=True, workers=1)
    run_job(convert.job_of(opts))
    job = convert.job_of(replace(opts, out=tmp_path / "units"))
    _in_fresh_processes(pickle.loads(pickle.dumps(job)), world=2)
    assert (tmp_path / "units" / "manifest.json").is_file() and len(list((tmp_path / "one").glob("*.tar"))) > 2
    assert tree_digest(tmp_path / "units") == tree_digest(tmp_path / "one")


def test_token_units_in_fresh_processes_make_the_one_process_bytes(texts: Path, bpe_tokenizer: Path,
                                                                   tmp_path: Path) -> None:
    opts = pack_tokens.PackTokensOptions(inputs=(str(texts),), out=tmp_path / "one", tokenizer=str(bpe_tokenizer),
                                         memory=256 << 10, shard_tokens=4000, quiet=True, workers=1,
                                         splits=(("train", 0.9), ("val", 0.1)))
    run_job(pack_tokens.job_of(opts))
    _in_fresh_processes(pack_tokens.job_of(replace(opts, out=tmp_path / "units")), world=3)
    assert len(list((tmp_path / "one").glob("train-*.bin"))) > 2
    assert tree_digest(tmp_path / "units") == tree_digest(tmp_path / "one")
