"""``--executor dask`` on a real Dask cluster: a ``dask scheduler`` and ``dask worker`` processes on
127.0.0.1, started here as a user starts them. The bytes are a local run's; a worker killed in the
middle of a unit, and a driver killed in the middle of a run, change none of them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Stall, free_port, run_cli, same_dataset, two_file_corpus

pytest.importorskip("distributed")
DASK = Path(sys.executable).parent / "dask"
UP_S = 60


@contextlib.contextmanager
def dask_cluster(log: Path, *, workers: int = 2, env: dict[str, str] | None = None) -> Iterator[str]:
    """A scheduler and ``workers`` single-threaded worker processes (each under a nanny, which
    restarts a killed one); yields the scheduler's address."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    environ = {**os.environ, **(env or {})}
    procs = []
    with open(log, "ab") as out:
        try:
            procs.append(subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                           "--no-dashboard"], stdout=out, stderr=out, env=environ,
                                          start_new_session=True))
            procs.append(subprocess.Popen([DASK, "worker", address, "--nworkers", str(workers), "--nthreads", "1",
                                           "--host", "127.0.0.1", "--no-dashboard"], stdout=out, stderr=out,
                                          env=environ, start_new_session=True))
            deadline = time.monotonic() + UP_S
            while True:
                try:
                    with Client(address, timeout=5) as client:
                        if len(client.scheduler_info()["workers"]) == workers:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            yield address
        finally:
            for p in procs:  # every process of the session: the workers, their nannies, the scheduler
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_file_corpus(tmp_path_factory.mktemp("dask-corpus"), 3000, seed=8, max_words=40, first=1300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with dask_cluster(tmp_path_factory.mktemp("dask") / "cluster.log") as address:
        yield address


def tokens(texts: Path, tokenizer: Path) -> list[str | Path]:
    return ["pack-tokens", texts, "--tokenizer", tokenizer, "--memory", "256KB", "--split", "train=0.9,val=0.1",
            "--shard-tokens", "15K", "--nanogpt", "--seed", "2", "-q"]


def shardsmith(*args: str | Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardsmith", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def stalled(proc: subprocess.Popen, mark: Path) -> None:
    """Wait until a unit of ``proc``'s run waits at its fault point (it created ``mark``)."""
    deadline = time.monotonic() + 300
    while not mark.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_dask_cluster_writes_the_local_bytes(cluster, texts, bpe_tokenizer, tmp_path, ranks):
    assert run_cli(*tokens(texts, bpe_tokenizer), "-o", tmp_path / "local").exit_code == 0
    proc = shardsmith(*tokens(texts, bpe_tokenizer), "-o", tmp_path / "dask", "--executor", "dask",
                      "--address", cluster, "--ranks", ranks)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err
    same_dataset(tmp_path / "local", tmp_path / "dask")


def test_a_worker_killed_mid_unit_changes_no_byte(texts, bpe_tokenizer, tmp_path):
    """Task 1's scatter waits at a fault point while its worker is SIGKILLed: the nanny starts
    a new worker, the scheduler runs the unit again, and the dataset is the local run's."""
    from distributed import Client

    assert run_cli(*tokens(texts, bpe_tokenizer), "-o", tmp_path / "local").exit_code == 0
    held = Stall(tmp_path, "scatter:1")
    with dask_cluster(tmp_path / "cluster.log", env=held.env) as address, Client(address, timeout=60) as watcher:
        proc = shardsmith(*tokens(texts, bpe_tokenizer), "-o", tmp_path / "dask", "--executor", "dask",
                          "--address", address, "--ranks", 2)
        stalled(proc, held.mark)
        busy = [w for w, keys in watcher.processing().items() if any("scatter" in str(k) for k in keys)]
        pids = watcher.run(os.getpid, workers=busy)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        held.release()  # the unit, run again on the new worker, passes the fault point
        out, err = proc.communicate(timeout=300)
    assert pids, "no worker was running a scatter unit"
    assert proc.returncode == 0 and "Traceback" not in err, err
    same_dataset(tmp_path / "local", tmp_path / "dask")


def test_a_driver_killed_mid_run_resumes_with_the_same_command(texts, bpe_tokenizer, tmp_path):
    assert run_cli(*tokens(texts, bpe_tokenizer), "-o", tmp_path / "local").exit_code == 0
    held = Stall(tmp_path, "scatter:1")
    args = [*tokens(texts, bpe_tokenizer), "-o", tmp_path / "dask", "--executor", "dask", "--ranks", 3]
    with dask_cluster(tmp_path / "cluster.log", env=held.env) as address:
        proc = shardsmith(*args, "--address", address)
        stalled(proc, held.mark)
        proc.kill()
        proc.communicate()
        assert not (tmp_path / "dask" / "manifest.json").exists()
        held.release()
        again = shardsmith(*args, "--address", address)
        out, err = again.communicate(timeout=300)
    assert again.returncode == 0 and "Traceback" not in err, err
    same_dataset(tmp_path / "local", tmp_path / "dask")


def test_a_scheduler_that_goes_away_is_one_line(texts, bpe_tokenizer, tmp_path):
    """The whole cluster ends while units run: one line naming the lost unit, exit 1; no traceback."""
    held = Stall(tmp_path, "scatter:1")  # never released: the cluster ends under it
    with dask_cluster(tmp_path / "cluster.log", env=held.env) as address:
        proc = shardsmith(*tokens(texts, bpe_tokenizer), "-o", tmp_path / "dask", "--executor", "dask",
                          "--address", address, "--ranks", 2)
        stalled(proc, held.mark)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert err.startswith("shardsmith: error: "), err
