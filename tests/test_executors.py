"""Executors (``shardsmith/executors``): a job's units on a Dask cluster (a LocalCluster of this
machine, started by the executor) make the bytes of a local run, for any number of ranks; the
options each executor takes, and one line for every failure. Real Ray, Dask scheduler and SLURM
clusters: tests/cluster (``make test-cluster``) and tests/slurm (``make test-slurm``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import free_port, run_cli, run_subprocess, same_dataset, two_file_corpus, write_jsonl

from shardsmith.errors import install_hint

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy

pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_file_corpus(tmp_path_factory.mktemp("exec-corpus"), 2000, seed=3, max_words=30, first=900)


def tokens_args(texts: Path, tokenizer: Path) -> list[str | Path]:
    return ["pack-tokens", texts, "--tokenizer", tokenizer, "--memory", "256KB", "--split", "train=0.9,val=0.1",
            "--shard-tokens", "12K", "--seed", "4", "-q"]


def tar_args(texts: Path) -> list[str | Path]:
    return ["convert", texts, "--to", "webdataset", "--text-field", "text", "--memory", "256KB",
            "--shard-samples", "300", "--split", "train=0.8,val=0.2", "-q"]


def ok(res) -> None:
    assert res.exit_code == 0, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("ranks", [2, 3])
def test_dask_local_cluster_writes_the_local_bytes(texts, bpe_tokenizer, tmp_path, ranks):
    for name, args in (("tokens", tokens_args(texts, bpe_tokenizer)), ("tar", tar_args(texts))):
        ok(run_cli(*args, "-o", tmp_path / f"{name}-local"))
        ok(run_cli(*args, "-o", tmp_path / f"{name}-dask", "--executor", "dask", "--ranks", ranks))
        same_dataset(tmp_path / f"{name}-local", tmp_path / f"{name}-dask")
        assert not (tmp_path / f".{name}-dask.shardsmith-work").exists()


def test_a_finished_dataset_is_said_complete_only_by_its_rerun(texts, tmp_path):
    args = [a for a in tar_args(texts) if a != "-q"]
    first = run_cli(*args, "-o", tmp_path / "out", "--executor", "dask", "--ranks", "2")
    ok(first)
    assert "already complete" not in first.stderr, first.stderr
    again = run_cli(*args, "-o", tmp_path / "out", "--executor", "dask", "--ranks", "3")
    ok(again)
    assert "already complete (this same command finished it; nothing to do)" in again.stderr, again.stderr
    assert "dask scatter" not in again.stderr  # nothing ran after the prepare unit
    assert again.output == first.output  # the summary line, from the manifest


def test_the_python_api_runs_a_job_on_a_client_of_the_callers(texts, bpe_tokenizer, tmp_path):
    from distributed import Client, LocalCluster

    from shardsmith.commands import pack_tokens
    from shardsmith.commands.convert import ConvertOptions, job_of, run
    from shardsmith.executors import DaskExecutor, executor_named
    from shardsmith.executors import run as run_job_on

    opts = ConvertOptions(inputs=(str(texts),), out=tmp_path / "local", to="webdataset", text_field="text",
                          memory=256 << 10, format_options={"shard_samples": 250}, quiet=True, workers=1)
    run(opts)
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        manifest = run(opts.__class__(**{**opts.__dict__, "out": tmp_path / "client"}),
                       executor=DaskExecutor(client=client, ranks=3))
        assert manifest["splits"]["train"]["samples"] == 2000
        assert client.status == "running"  # the caller's client is left open
        again = run_job_on(job_of(opts.__class__(**{**opts.__dict__, "out": tmp_path / "named"})),
                           executor=DaskExecutor(client=client))  # ranks: the cluster's 2 threads
        # the README's way: options with plain strings, out included
        tokens = pack_tokens.run(pack_tokens.PackTokensOptions(inputs=(str(texts),), out=str(tmp_path / "str"),
                                                               tokenizer=str(bpe_tokenizer), quiet=True),
                                 executor=DaskExecutor(client=client, ranks=2))
        assert (tmp_path / "str" / "manifest.json").is_file() and tokens["splits"]["train"]["samples"] == 2000
    same_dataset(tmp_path / "local", tmp_path / "client")
    same_dataset(tmp_path / "local", tmp_path / "named")
    assert again["splits"] == manifest["splits"]
    with pytest.raises(Exception, match="--address applies to --executor dask or ray, not to local"):
        executor_named("local", address="tcp://127.0.0.1:1")


def test_a_bad_record_on_a_rank_is_one_line_naming_rank_and_file(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", [f"doc {i}" for i in range(50)])
    with open(tmp_path / "in" / "b.jsonl", "a") as fh:
        fh.write('{"text": "fine"}\n{"text": broken\n')
    args = ["convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "webdataset", "--text-field", "text", "-q"]
    local = run_cli(*args)
    assert local.exit_code == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["in"], local.stderr
    res = run_cli(*args, "--executor", "dask", "--ranks", "2")
    assert res.exit_code == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "scatter rank" in lines[0] and "of 2 failed" in lines[0] and "b.jsonl: line 2" in lines[0], lines[0]
    # what the failed local run leaves: nothing (no output folder, scratch folder or lock file)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    # mended, the same command starts over (the failed run's scratch folder replaced, as a local run does)
    (tmp_path / "in" / "b.jsonl").write_text('{"text": "fine"}\n{"text": "mended"}\n')
    ok(run_cli("convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "webdataset", "--text-field", "text",
               "--executor", "dask", "--ranks", "2", "-q"))
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["splits"]["train"]["samples"] == 52


def test_a_prepare_unit_failing_after_its_claim_leaves_what_a_local_run_leaves(tmp_path):
    """The first unit claims the folder (its run record) and then fails (its scratch folder's name is
    a file): released as a failed local run releases it, not left half made."""
    write_jsonl(tmp_path / "in" / "a.jsonl", [f"doc {i}" for i in range(20)])
    (tmp_path / ".out.shardsmith-work").write_text("a file of the user's")
    args = ["convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "webdataset", "--text-field", "text", "-q"]
    for extra in ([], ["--executor", "dask", "--ranks", "1"]):
        res = run_cli(*args, *extra)
        assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1, (extra, res.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".out.shardsmith-work", "in"], extra


def test_the_cluster_we_start_prints_nothing_of_its_own(capfd):
    """The LocalCluster the executor starts shares our stderr with its worker processes: a record
    its workers log must not reach it (after a failed unit, a worker still running a cancelled one
    logged its heartbeat to the closing scheduler: a 28-line traceback after our one line, in some
    runs); nor the scheduler's warning that port 8787 is taken (by another Dask on this machine)."""
    from shardsmith.executors import DaskExecutor

    with contextlib.ExitStack() as stack, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        taken = stack.enter_context(socket.socket())
        with contextlib.suppress(OSError):  # (taken already: the same for the test)
            taken.bind(("127.0.0.1", 8787))
            taken.listen()
        with DaskExecutor(ranks=1).session() as client:
            # what the worker logs when its heartbeat meets a closed scheduler
            ran = client.run(lambda: logging.getLogger("distributed.worker").error(
                "Failed to communicate with scheduler during heartbeat.", exc_info=OSError("Stream is closed")))
            client.run(os.write, 2, b"the worker's own stderr\n")  # (it is captured here)
    assert ran  # every worker logged it
    assert capfd.readouterr().err == "the worker's own stderr\n"
    assert not [w for w in caught if "already in use" in str(w.message)], [str(w.message) for w in caught]


def test_another_rank_count_resumes_the_units_a_run_left(texts, bpe_tokenizer, tmp_path):
    """A run left half done on 3 ranks (scatter ranks 0 and 2, plan, gather rank 1), finished on 2 ranks:
    the local bytes (task parts and shard ranges do not depend on the rank count)."""
    args = tokens_args(texts, bpe_tokenizer)
    ok(run_cli(*args, "-o", tmp_path / "local"))
    out = tmp_path / "mixed"
    for stage, rank in (("scatter", 0), ("scatter", 2), ("scatter", 1), ("plan", 0), ("gather", 1)):
        ok(run_cli(*args, "-o", out, "--stage", stage, "--rank", rank, "--world-size", 3))
    ok(run_cli(*args, "-o", out, "--executor", "dask", "--ranks", 2))
    same_dataset(tmp_path / "local", out)


def test_options_an_executor_does_not_take_are_refused(texts, tmp_path):
    cases = [
        (["--ranks", "2"], "--ranks applies to --executor ray, dask or slurm"),
        (["--executor", "dask", "--no-wait"], "--no-wait applies to --executor slurm, not to dask"),
        (["--executor", "ray", "--slurm-arg=--partition=cpu"], "--slurm-arg applies to --executor slurm, not to ray"),
        (["--executor", "dask", "--stage", "scatter"], "--stage runs one unit here"),
        (["--executor", "dask", "--ranks", "0"], "--ranks"),
    ]
    missing = run_cli("convert", tmp_path / "nowhere", "-o", tmp_path / "out", "--to", "webdataset",
                      "--executor", "dask")
    assert missing.exit_code == 2, missing.stderr
    assert missing.stderr.splitlines()[-1] == f"shardsmith: error: {tmp_path / 'nowhere'}: no such file or folder"
    for extra, message in cases:
        res = run_cli(*tar_args(texts), "-o", tmp_path / "out", *extra)
        assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.stderr, (extra, res.stderr)
    assert not (tmp_path / "out").exists()


def test_an_unreachable_scheduler_is_one_line(texts, tmp_path):
    res = run_subprocess(*tar_args(texts), "-o", tmp_path / "out", "--executor", "dask",
                         "--address", f"tcp://127.0.0.1:{free_port()}")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().count("\n") == 0 and "no scheduler answers at tcp://127.0.0.1:" in res.stderr, res.stderr


@pytest.mark.parametrize("executor,module,extra", [("dask", "distributed", "dask"), ("ray", "ray", "ray")])
def test_a_missing_engine_is_one_line_naming_its_extra(texts, tmp_path, executor, module, extra):
    # the engine's package made unimportable in a fresh interpreter, as on a machine without it
    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv = ['shardsmith', *sys.argv[1:]]; "
            "from shardsmith.program import main; main()")
    res = subprocess.run([sys.executable, "-c", code, *map(str, tar_args(texts)), "-o", str(tmp_path / "out"),
                          "--executor", executor], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (f"shardsmith: error: --executor {executor} needs the {module} package: "
                                  f"{install_hint(extra)}"), res.stderr


def test_a_killed_local_run_is_finished_by_an_executor_and_back(texts, bpe_tokenizer, tmp_path):
    """Killed (SIGKILL) mid-scatter on one machine, finished on Dask; and the other way round."""

    args = tokens_args(texts, bpe_tokenizer)
    ok(run_cli(*args, "-o", tmp_path / "local"))
    crash = {**os.environ, "SHARDSMITH_CRASH_AT": "scatter:1"}
    killed = run_subprocess(*args, "-o", tmp_path / "a", "--workers", "1", env=crash)
    assert killed.returncode == -9, killed.stderr
    assert any((tmp_path / ".a.shardsmith-work").glob("part-*.bin"))  # task 0's part: kept for the rerun
    ok(run_cli(*args, "-o", tmp_path / "a", "--executor", "dask", "--ranks", 2))
    same_dataset(tmp_path / "local", tmp_path / "a")
    # half a staged run on 2 ranks (what a killed driver leaves), finished by a local run
    ok(run_cli(*args, "-o", tmp_path / "b", "--stage", "scatter", "--rank", 1, "--world-size", 2))
    ok(run_cli(*args, "-o", tmp_path / "b"))
    same_dataset(tmp_path / "local", tmp_path / "b")


def test_a_recipe_names_its_executor(texts, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'command = "convert"\ninputs = ["{texts}"]\nout = "{tmp_path / "out"}"\n[options]\n'
                      f'to = "webdataset"\ntext-field = "text"\nshard-samples = 300\nexecutor = "dask"\nranks = 2\n'
                      f'quiet = true\n')
    res = run_cli("run", recipe)
    assert res.exit_code == 0, res.stderr
    assert "--executor dask --ranks 2" in res.stderr  # the command line the recipe stands for
    ok(run_cli("convert", texts, "--to", "webdataset", "--text-field", "text", "--shard-samples", "300", "-q",
               "-o", tmp_path / "local"))
    same_dataset(tmp_path / "local", tmp_path / "out")


def test_dedup_on_dask_drops_the_documents_a_local_run_drops(bpe_tokenizer, tmp_path):
    """The duplicates are decided once, from the facts every scatter rank wrote: the same
    documents go, the same bytes and the same --removed list come out."""
    from test_dedup_exact import planted

    planted(tmp_path / "in", seed=8, n=600)
    args = ["pack-tokens", tmp_path / "in", "--tokenizer", bpe_tokenizer, "--memory", "256KB", "--dedup", "exact",
            "--split", "train=0.9,val=0.1", "-q"]
    ok(run_cli(*args, "-o", tmp_path / "local", "--removed", tmp_path / "local.jsonl"))
    ok(run_cli(*args, "-o", tmp_path / "dask", "--removed", tmp_path / "dask.jsonl", "--executor", "dask",
               "--ranks", "3"))
    same_dataset(tmp_path / "local", tmp_path / "dask")
    assert (tmp_path / "local.jsonl").read_text() == (tmp_path / "dask.jsonl").read_text() != ""
