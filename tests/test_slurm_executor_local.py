"""``--executor slurm`` where no cluster is: the one-line refusals, and its options read before any
submission (the jobs themselves: tests/slurm/test_slurm_executor.py, ``make test-slurm``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_docs, write_jsonl

from shardsmith.errors import UsageError, install_hint


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardsmith", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _no_sbatch_env(tmp_path: Path) -> dict[str, str]:
    """This environment with a PATH that holds no sbatch (nor anything else)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    root = Path(__file__).resolve().parents[1]
    return dict(os.environ, PATH=str(empty), PYTHONPATH=os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p))


@pytest.mark.parametrize("command", [["convert", "data", "--to", "webdataset"], ["pack-tokens", "data",
                                                                                "--train-tokenizer", "300"]])
def test_without_sbatch_the_slurm_executor_is_one_line_and_exit_2(tmp_path, command):
    pytest.importorskip("submitit")
    write_jsonl(tmp_path / "data/a.jsonl", make_docs(20))
    res = _cli([*command, "-o", "out", "--executor", "slurm"], tmp_path, _no_sbatch_env(tmp_path))
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == ["shardsmith: error: --executor slurm: sbatch not found on PATH: run where "
                                       "SLURM jobs are submitted (a login node), or choose --executor local"]
    assert res.stdout == "" and not (tmp_path / "out").exists() and not (tmp_path / "slurm-logs").exists()


def test_without_submitit_the_slurm_executor_names_the_extra(tmp_path):
    """submitit made unimportable in the child (a None entry in sys.modules), as if not installed."""
    write_jsonl(tmp_path / "data/a.jsonl", make_docs(20))
    code = ("import sys; sys.modules['submitit'] = None; from shardsmith.cli import main; "
            "main(['convert', 'data', '--to', 'webdataset', '-o', 'out', '--executor', 'slurm'])")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_no_sbatch_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == ["shardsmith: error: --executor slurm needs the submitit package: "
                                       f"{install_hint('slurm')}"]


def test_slurm_args_become_sbatch_parameters():
    from shardsmith.executors.slurm import DEFAULT_TIME_MIN, parse_slurm_args

    options, minutes = parse_slurm_args(["--partition=cpu", "--cpus-per-task=1", "--mem=1G", "--exclusive",
                                         "--mem=2G", "--comment=a b=c"])
    assert options == {"partition": "cpu", "cpus_per_task": "1", "mem": "2G", "exclusive": True,
                       "comment": "a b=c"}  # submitit's names (its own value is replaced), the last one wins
    assert minutes == DEFAULT_TIME_MIN
    for given, expected in [("90", 90), ("90:30", 91), ("2:00:00", 120), ("1-0", 1440), ("1-2:30", 1590),
                            ("0-0:0:59", 1), ("UNLIMITED", 365 * 24 * 60)]:
        options, minutes = parse_slurm_args([f"--time={given}"])
        assert (options["time"], minutes) == (given, expected)


@pytest.mark.parametrize("arg, message", [
    ("-p cpu", "give one long sbatch option"), ("partition=cpu", "give one long sbatch option"),
    ("--", "give one long sbatch option"), ("--array=0-3", "sets --array itself"),
    ("--dependency=afterok:1", "sets --dependency itself"), ("--output=x.log", "sets --output itself"),
    ("--time=soon", "not a SLURM time"),
])
def test_bad_slurm_args_are_refused(arg, message):
    from shardsmith.executors.slurm import parse_slurm_args

    with pytest.raises(UsageError, match=message):
        parse_slurm_args([arg])


def test_the_submitted_line():
    from shardsmith.executors.slurm import submitted_line

    ids = {"scatter": "7", "plan": "8", "gather": "9", "finalize": "10"}
    assert submitted_line(ids, 4) == ("scatter job 7 (array 0-3), plan job 8, gather job 9 (array 0-3), finalize "
                                      "job 10; watch: squeue -j 7,8,9,10")
    assert submitted_line(ids, 1) == ("scatter job 7, plan job 8, gather job 9, finalize job 10; watch: squeue -j "
                                      "7,8,9,10")


def test_no_wait_and_slurm_arg_refused_by_other_executors(tmp_path):
    write_jsonl(tmp_path / "data/a.jsonl", make_docs(20))
    for extra, flag in ((["--no-wait"], "--no-wait"), (["--slurm-arg=--mem=1G"], "--slurm-arg")):
        res = _cli(["convert", "data", "--to", "webdataset", "-o", "out", "--executor", "dask", *extra], tmp_path,
                   dict(os.environ))
        assert res.returncode == 2, res.stderr
        assert f"{flag} applies to --executor slurm, not to dask" in res.stderr
