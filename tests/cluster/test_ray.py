"""``--executor ray`` on a real Ray cluster: a head and a second node started here, in the loopback-only
network namespace of `make test-cluster` (docs: ../shared/notes/distributed-engines.md).

Each job runs through the CLI as a user runs it and must write the bytes of a local run, for any
``--ranks``; a killed Ray worker, a killed driver, a bad input line and a cluster that does not
answer each end as the user is told they do. Only the processes started here are ended: ``ray stop``
would end every Ray of the machine (a network namespace shares the process table).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import free_port, make_docs, root_data, tree_digest, two_file_corpus, write_jsonl

from shardsmith.demo.icecube_like import make_icecube_kaggle_like

psutil = pytest.importorskip("psutil")
RAY = Path(sys.executable).with_name("ray")
TIMINGS: dict[str, float] = {}


def loopback_only() -> bool:
    """This process's network namespace holds only ``lo`` (``if_nameindex`` asks the namespace itself;
    /sys/class/net would show the host's interfaces, sysfs being mounted outside ``unshare -n``)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


@dataclass
class Cluster:
    address: str
    tmp: Path  # RAY_TMPDIR and HOME of the cluster and of every command run here: its address file, logs, token

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: those naming its folder and their children (the workers)."""
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(self.tmp) in part for part in proc.info["cmdline"] or ()):
                for p in [proc, *_children(proc)]:
                    found[p.pid] = p
        return list(found.values())

    def unit_workers(self) -> list[psutil.Process]:
        """The worker processes running a unit now (Ray titles them after the task's function)."""
        return [p for p in self.processes() if _cmdline(p).startswith("ray::run_remote")]


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if not loopback_only():
        pytest.skip("Ray runs only in a loopback-only network namespace: run `make test-cluster`")
    if not RAY.is_file():
        pytest.skip(f"no ray command next to {sys.executable}: pip install 'shardsmith[ray]'")
    tmp = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))  # short: Ray's socket paths live below it
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", str(tmp))
        # a home of its own: Ray 2.60 keeps a token in ~/.ray/auth_token (a new local Ray writes one,
        # `ray start` turns token auth on when it finds one), which other Rays of the machine share
        mp.setenv("HOME", str(tmp))
        for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            mp.delenv(name, raising=False)
        c = Cluster(address=f"127.0.0.1:{port}", tmp=tmp)
        try:
            start = time.monotonic()
            _ray("start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                 "--disable-usage-stats")
            TIMINGS["ray start --head"] = time.monotonic() - start
            start = time.monotonic()
            _ray("start", f"--address={c.address}", "--num-cpus=1", "--disable-usage-stats")
            TIMINGS["ray start (second node)"] = time.monotonic() - start
            yield c
        finally:
            _end(c)
            print("\nray timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))
    shutil.rmtree(tmp, ignore_errors=True)


def _ray(*args: str) -> None:
    res = subprocess.run([str(RAY), *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def _end(c: Cluster) -> None:
    """SIGKILL this cluster's processes (by PID, twice: a raylet may start a worker meanwhile)."""
    for _ in range(2):
        for proc in c.processes():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        time.sleep(0.5)


def shardsmith(*args: str | Path, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, in its own process (the driver)."""
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def ok(res: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert res.returncode == 0, res.stderr
    return res


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    """The whole of stderr, which must be one line and no traceback."""
    err = res.stderr.strip()
    assert err and "\n" not in err and "Traceback" not in err, res.stderr
    return err


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_file_corpus(tmp_path_factory.mktemp("ray-corpus"), 2500, seed=11, max_words=40, first=1200)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 60 MB of JSONL in 6 files: a scatter unit runs for seconds, long enough to be killed."""
    root = tmp_path_factory.mktemp("ray-big")
    block = write_jsonl(root / "block", make_docs(20000, seed=5, max_words=60)).read_bytes()
    (root / "block").unlink()
    for i in range(6):
        (root / f"part{i}.jsonl").write_bytes(block * 5)
    return root


def tokens_args(texts: Path, tok: Path) -> list[str | Path]:
    return ["pack-tokens", texts, "--tokenizer", tok, "--memory", "256KB", "--split", "train=0.9,val=0.1",
            "--shard-tokens", "15K", "--nanogpt", "-q"]


def on_ray(cluster: Cluster, ranks: int) -> list[str]:
    return ["--executor", "ray", "--address", cluster.address, "--ranks", str(ranks)]


@pytest.mark.parametrize("ranks", [2, 3])
def test_tokens_on_ray_are_a_local_runs_bytes(cluster, texts, bpe_tokenizer, tmp_path, ranks):
    args = tokens_args(texts, bpe_tokenizer)
    start = time.monotonic()
    ok(shardsmith(*args, "-o", tmp_path / "local"))
    TIMINGS["small pack-tokens, local"] = time.monotonic() - start
    start = time.monotonic()
    res = ok(shardsmith(*args, "-o", tmp_path / "ray", *on_ray(cluster, ranks)))
    TIMINGS[f"small pack-tokens, ray --ranks {ranks}"] = time.monotonic() - start
    assert res.stderr == "", res.stderr  # -q: nothing of Ray's reaches the user
    assert tree_digest(tmp_path / "ray") == tree_digest(tmp_path / "local")


@pytest.mark.parametrize("ranks", [2, 3])
def test_tar_and_hdf5_on_ray_are_a_local_runs_bytes(cluster, texts, tmp_path, ranks):
    args = ["convert", texts, "--to", "webdataset", "--text-field", "text", "--memory", "256KB",
            "--shard-samples", "400", "-q"]
    ok(shardsmith(*args, "-o", tmp_path / "tar-local"))
    ok(shardsmith(*args, "-o", tmp_path / "tar-ray", *on_ray(cluster, ranks)))
    assert tree_digest(tmp_path / "tar-ray") == tree_digest(tmp_path / "tar-local")

    batches, meta = make_icecube_kaggle_like(tmp_path / "ic", batches=2, events_per_batch=150, mean_pulses=20,
                                             seed=2, row_group_rows=1500)
    args = ["convert", *batches, "--group-by", "event_id", "--events-table", meta, "--to", "hdf5",
            "--memory", "128KB", "--shard-samples", "100", "-q"]
    ok(shardsmith(*args, "-o", tmp_path / "h5-local"))
    ok(shardsmith(*args, "-o", tmp_path / "h5-ray", *on_ray(cluster, ranks)))
    assert tree_digest(tmp_path / "h5-ray") == tree_digest(tmp_path / "h5-local")


@pytest.mark.parametrize("ranks", [2, 3])
def test_root_events_on_ray_are_a_local_runs_bytes(cluster, tmp_path, ranks):
    args = ["convert", root_data() / "uproot-HZZ.root", "--to", "hdf5", "--shard-samples", "700", "-q"]
    ok(shardsmith(*args, "-o", tmp_path / "local"))
    ok(shardsmith(*args, "-o", tmp_path / "ray", *on_ray(cluster, ranks)))
    assert tree_digest(tmp_path / "ray") == tree_digest(tmp_path / "local")


def test_address_auto_joins_the_running_cluster(cluster, texts, bpe_tokenizer, tmp_path):
    """``auto``: the cluster this machine's ``ray start`` wrote down (under RAY_TMPDIR, here this one's)."""
    args = tokens_args(texts, bpe_tokenizer)
    ok(shardsmith(*args, "-o", tmp_path / "local"))
    res = ok(shardsmith(*args, "-o", tmp_path / "ray", "--executor", "ray", "--address", "auto", "--ranks", "2"))
    assert res.stderr == "", res.stderr
    assert tree_digest(tmp_path / "ray") == tree_digest(tmp_path / "local")


def test_an_unreachable_cluster_is_one_line_within_seconds(cluster, texts, bpe_tokenizer, tmp_path):
    closed = free_port()
    start = time.monotonic()
    res = shardsmith(*tokens_args(texts, bpe_tokenizer), "-o", tmp_path / "o", "--executor", "ray", "--address",
                     f"127.0.0.1:{closed}", timeout=60)
    TIMINGS["unreachable --address"] = took = time.monotonic() - start
    assert res.returncode == 2, res.stderr
    assert f"127.0.0.1:{closed}" in one_line(res)
    assert took < 15, took


def test_a_bad_line_is_one_line_naming_the_rank_and_the_file(cluster, tmp_path, bpe_tokenizer):
    docs = make_docs(200, seed=1)
    write_jsonl(tmp_path / "in" / "a.jsonl", docs[:100])
    bad = write_jsonl(tmp_path / "in" / "b.jsonl", docs[100:])
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([*lines[:5], '{"text": "unterminated', *lines[5:]]) + "\n")
    res = shardsmith("pack-tokens", tmp_path / "in", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "-q",
                     *on_ray(cluster, 2))
    assert res.returncode == 1, res.stderr
    line = one_line(res)
    assert "scatter rank " in line and " of 2 failed" in line and "b.jsonl: line 6:" in line, line
    assert not (tmp_path / "o" / "manifest.json").exists()


def _wait_for(what, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    return None


def test_a_killed_worker_is_retried_by_ray_and_the_bytes_are_the_same(cluster, big, bpe_tokenizer, tmp_path):
    args = ["pack-tokens", big, "--tokenizer", bpe_tokenizer, "--memory", "4MB", "-q"]
    ok(shardsmith(*args, "-o", tmp_path / "local", timeout=600))
    driver = subprocess.Popen([sys.executable, "-m", "shardsmith", *map(str, args), "-o", tmp_path / "ray",
                               *on_ray(cluster, 3)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        workers = _wait_for(cluster.unit_workers)
        assert workers, "no Ray worker ran a unit"
        time.sleep(0.5)  # well into the unit
        victim = workers[0]
        assert _cmdline(victim).startswith("ray::run_remote"), "the unit ended before the kill"
        victim.kill()
        out, err = driver.communicate(timeout=600)
    finally:
        driver.kill()
    assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE
    # Ray runs the unit again on another worker (max_retries): the run itself finishes
    assert driver.returncode == 0, err
    assert "Traceback" not in err, err
    assert tree_digest(tmp_path / "ray") == tree_digest(tmp_path / "local")


class Driver:
    """The CLI running in the background, its stderr (the phases' bars) read as it comes."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.err = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while chunk := self.proc.stderr.read1(4096):
            self.err += chunk

    def said(self, text: str) -> bool:
        return text.encode() in self.err

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)


@pytest.mark.parametrize("when", ["scatter", "plan"])
def test_a_killed_driver_then_the_same_command_gives_the_same_bytes(cluster, big, bpe_tokenizer, tmp_path, when):
    """The driver says "ray STAGE" (off a terminal) once that stage is done: killed after the scatter (the
    plan, gather and finalize to come) or after the plan (the gather running; the finalize, which reads only
    the plan's index and the pieces, is too short to be caught in)."""
    args = ["pack-tokens", big, "--tokenizer", bpe_tokenizer, "--memory", "4MB", "--shard-tokens", "2M"]
    ok(shardsmith(*args, "-q", "-o", tmp_path / "local", timeout=600))
    cmd = [sys.executable, "-m", "shardsmith", *map(str, args), "-o", str(tmp_path / "ray"), *on_ray(cluster, 3)]
    driver = Driver(cmd)
    try:
        assert _wait_for(lambda: driver.said(f"ray {when}"), timeout=300), driver.err.decode()
        assert _wait_for(cluster.unit_workers), "no Ray worker ran a unit"
        driver.kill()
    finally:
        driver.kill()
    # Ray ends the dead driver's tasks; wait for them before the rerun
    assert _wait_for(lambda: not cluster.unit_workers(), timeout=60) is not None, "the dead driver's units still run"
    assert not (tmp_path / "ray" / "manifest.json").exists()
    ok(subprocess.run([*cmd, "-q"], capture_output=True, text=True, timeout=600))
    assert tree_digest(tmp_path / "ray") == tree_digest(tmp_path / "local")


def test_without_address_a_ray_is_started_for_the_run(cluster, texts, bpe_tokenizer, tmp_path):
    args = tokens_args(texts, bpe_tokenizer)
    ok(shardsmith(*args, "-o", tmp_path / "local"))
    before = {p.pid for p in cluster.processes()}
    start = time.monotonic()
    res = ok(shardsmith(*args, "-o", tmp_path / "ray", "--executor", "ray", "--ranks", "2"))
    TIMINGS["small pack-tokens, ray started for the run"] = time.monotonic() - start
    assert res.stderr == "", res.stderr
    assert tree_digest(tmp_path / "ray") == tree_digest(tmp_path / "local")
    time.sleep(1)
    left = [p for p in cluster.processes() if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [_cmdline(p)[:100] for p in left]  # the run's own Ray ended with it
