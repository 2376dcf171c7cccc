"""Benchmark of the executors (issue 28): one job on Dask and Ray clusters against the local run.

    python bench/bench_executors.py [--mb 1000] [--events-mb MB] [--ranks 2,4,8] [--executors local,dask,ray]
                                    [--only tokens,events] [--repeat 1] [--workdir /tmp/shardsmith-bench]

Ray may only run inside a network namespace that holds nothing but loopback: when Ray is asked for
and this process is not in one, the script runs itself again as `unshare -n sh -c 'ip link set lo up
&& exec python bench/bench_executors.py ...'` (root; without it the Ray rows say why they are
missing). Dask runs on loopback inside the same namespace.

Two workloads, each `--mb` MB (10**6 B) of input, warm page cache, every run a `shardsmith` child
process, wall time including start-up:
  * tokens: `pack-tokens` of the bench/corpus.py JSONL with the byte-level BPE of bench/make_tokenizers.py
    (the headline), `--shard-tokens` set for about 8 shards;
  * events: `convert --to hdf5` of an IceCube-like ROOT file (shardsmith.demo.root_files.make_icecube_like,
    ~2,580 B an event, bench_events.py's 7 branches), `--shard-samples` for about 8 shards.
Rows: the local run with `--workers 2` (the reference); `--executor dask --address tcp://127.0.0.1:P`
and `--executor ray --address 127.0.0.1:P` at each `--ranks` (each unit `--workers 1`, the executors'
default), on clusters of 2 single-threaded workers (Dask: a scheduler and `dask worker --nworkers 2
--nthreads 1`; Ray: a head with `--num-cpus=2`) started once for the whole run. Every output is
checked against the local one (sha256 of every file; manifest.json without `created`/`command`; the
dataset card without its command line). Runs are interleaved (each repeat goes through every row).

While a run goes on, a thread here watches its scratch folder (`.OUT.shardsmith-work/`, every 0.1 s):
the first moment it exists (a unit, or the local run, has claimed the output: what the executor spent
before any unit worked, set against the local run's), and every part file the scatter renames into it
(names and sizes: the bytes written to the shared folder, which the gather reads back).

Then, per --ranks W, an untimed counting pass runs the same job as W scatter, W gather and one finalize
`--stage` processes one after another (what an executor's units run, one unit a process), with a
Python audit hook that counts the opens of part files in each process, and reads each process's
/proc/self/io (rchar: bytes its read calls returned, from every file; part files the HDF5 writer maps
are not counted there). Each unit's wall time gives the per-unit figures the paper estimate in
bench/README.md ("Executors (issue 28)") starts from.

Start-up: the time from starting each cluster to its first answer (2 workers seen), a fresh process's
import + connect + one trivial task (what every `shardsmith --executor` run pays), and a tiny job
(100 KB of the corpus, pack-tokens) on each executor against the local run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from bench_stages import BRANCHES, scratch_of, tree_digest  # noqa: E402
from harness import byte_compiled, clear, code_version, key_figure, run_children, verdict, warm  # noqa: E402

GOAL = 1.15  # issue 28: within 1.15x of the local run at 1 GB
SHARDS = 8
EVENT_BYTES = 2580  # bytes of the IceCube-like ROOT file per event (240 pulses, seed 0)
NETNS_ENV = "SHARDSMITH_BENCH_NETNS"
CLUSTER_ENV = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "RANK", "WORLD_SIZE")
TINY_BYTES = 100_000


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def loopback_only() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


RAY_HOME: list[Path] = []  # the home of every Ray process here (set by start_ray)
RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def child_env(extra_path: str | None = None, *, ray: bool = False) -> dict[str, str]:
    """The children import this worktree's shardsmith (not whatever the venv's editable install names).
    ``ray``: a home of its own for Ray 2.60, which keeps a token in ~/.ray/auth_token (shared by every
    Ray of the machine: another one's token, written meanwhile, breaks connecting to ours)."""
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV and not (ray and k in RAY_ENV)}
    if ray and RAY_HOME:
        env["HOME"] = str(RAY_HOME[0])
    paths = [str(REPO)] + ([extra_path] if extra_path else []) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- clusters (our own processes only)

def _become_subreaper() -> None:
    """Daemons that `ray start` forks are re-parented to this process (not to init), so that the end
    of the benchmark finds them among its own descendants and ends them by their ids."""
    import ctypes

    with_libc = ctypes.CDLL(None, use_errno=True)
    with_libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _descendants(pid: int) -> list[int]:
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                kids = [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
                out += kids
                stack += kids
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


@dataclass
class Cluster:
    name: str
    address: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    startup_s: float = float("nan")
    error: str = ""
    temp: Path | None = None  # Ray's session folder, removed at the end


def stop_all(clusters: list[Cluster]) -> None:
    """End the clusters this benchmark started: their process groups, then whatever of them is left
    among this process's descendants (Ray's daemons, re-parented here), each by its id. Called when
    no timed child runs: every descendant then is a cluster's."""
    procs = [p for c in clusters for p in c.procs]
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
    for c in clusters:
        if c.temp is not None:
            shutil.rmtree(c.temp, ignore_errors=True)


PROBE = {
    "dask": """
import json, sys, time
t0 = time.perf_counter()
from distributed import Client
t1 = time.perf_counter()
c = Client(sys.argv[1], timeout=30)
c.wait_for_workers(2, timeout=120)
t2 = time.perf_counter()
assert c.submit(lambda: 1, pure=False).result() == 1
t3 = time.perf_counter()
c.close()
print(json.dumps({"import": t1 - t0, "connect": t2 - t1, "task": t3 - t2}))
""",
    "ray": """
import json, sys, time
t0 = time.perf_counter()
import ray
t1 = time.perf_counter()
ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, configure_logging=False, logging_level="ERROR")
while ray.cluster_resources().get("CPU", 0) < 2:
    time.sleep(0.05)
t2 = time.perf_counter()
f = ray.remote(num_cpus=1)(lambda: 1)
assert ray.get(f.remote()) == 1
t3 = time.perf_counter()
ray.shutdown()
print(json.dumps({"import": t1 - t0, "connect": t2 - t1, "task": t3 - t2}))
""",
}


def probe(name: str, address: str, log: Path) -> dict:
    """A fresh process: import the engine, connect (2 workers there), one trivial task."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROBE[name], address], capture_output=True, text=True,
                         env=child_env(ray=name == "ray"), timeout=180)
    wall = time.perf_counter() - t0
    log.write_text(out.stderr)
    if out.returncode:
        raise RuntimeError(f"{name} probe exited {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "wall": wall}


def daemon(cmd: list[str], log: Path, *, ray: bool = False) -> subprocess.Popen:
    """A cluster process in a process group of its own (ended by stop_all), output to ``log``."""
    with open(log, "w") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=child_env(ray=ray),
                                start_new_session=True)


def start_dask(logs: Path) -> Cluster:
    port = free_port()
    c = Cluster("dask", address=f"tcp://127.0.0.1:{port}")
    bindir = Path(sys.executable).parent
    t0 = time.perf_counter()
    c.procs.append(daemon([str(bindir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                           "--no-dashboard"], logs / "dask-scheduler.log"))
    c.procs.append(daemon([str(bindir / "dask"), "worker", c.address, "--nworkers", "2", "--nthreads", "1",
                           "--host", "127.0.0.1", "--no-dashboard"], logs / "dask-worker.log"))
    try:
        probe("dask", c.address, logs / "dask-probe-start.log")
        c.startup_s = time.perf_counter() - t0
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        c.error = str(e)[:200]
    return c


def start_ray(logs: Path) -> Cluster:
    port = free_port()
    c = Cluster("ray", address=f"127.0.0.1:{port}")
    temp = c.temp = Path(tempfile.mkdtemp(prefix="ray-bench-", dir="/tmp"))  # its own session folder (short: sockets)
    RAY_HOME[:] = [temp]
    if not loopback_only():
        c.error = "not run: Ray only runs in a loopback-only network namespace (run as root: this script enters one)"
        return c
    bindir = Path(sys.executable).parent
    t0 = time.perf_counter()
    # --block: `ray start` stays in the foreground and ends the daemons it started when it is ended
    c.procs.append(daemon([str(bindir / "ray"), "start", "--head", f"--port={port}", "--num-cpus=2",
                           "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats",
                           "--object-store-memory=500000000", f"--temp-dir={temp}", "--block"], logs / "ray-start.log", ray=True))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            probe("ray", c.address, logs / "ray-probe-start.log")
            c.startup_s = time.perf_counter() - t0
            break
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            c.error = str(e)[:200]
            if c.procs[0].poll() is not None:
                break
            time.sleep(0.5)
    else:
        c.error = c.error or "no answer in 120 s"
    if c.startup_s == c.startup_s:  # not NaN
        c.error = ""
    return c


# ---------------------------------------------------------------- watching the scratch folder

class Watch(threading.Thread):
    """Polls a run's scratch folder: when it first exists, its part files (name -> size) and its peak size."""

    def __init__(self, scratch: Path, t0: float) -> None:
        super().__init__(daemon=True)
        self.scratch, self.t0 = scratch, t0
        self.first: float | None = None
        self.parts: dict[str, int] = {}
        self.peak = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.poll()
            self._halt.wait(0.1)

    def poll(self) -> None:
        try:
            entries = list(os.scandir(self.scratch))
        except (FileNotFoundError, NotADirectoryError):
            return
        if self.first is None:
            self.first = time.perf_counter() - self.t0
        total = 0
        for e in entries:
            try:
                if not e.is_file(follow_symlinks=False):
                    continue
                size = e.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
            total += size
            if e.name.startswith("part-") and e.name.endswith(".bin"):
                self.parts[e.name] = size
        self.peak = max(self.peak, total)

    def stop(self) -> None:
        self._halt.set()
        self.join()


# ---------------------------------------------------------------- workloads and runs

@dataclass
class Workload:
    name: str
    title: str
    args: list[str]
    inputs: list[Path]
    input_bytes: int


@dataclass
class Row:
    key: str  # local, dask-R, ray-R
    walls: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    parts: list[int] = field(default_factory=list)
    part_bytes: list[int] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)
    out_bytes: list[int] = field(default_factory=list)
    identical: bool | None = None
    mismatch: str = ""
    error: str = ""


def executor_args(key: str, clusters: dict[str, Cluster]) -> list[str]:
    if key == "local":
        return ["--workers", "2"]
    name, ranks = key.split("-")
    return ["--executor", name, "--address", clusters[name].address, "--ranks", ranks]


def lock_of(out: Path) -> Path:
    """The empty lock file a run leaves beside its output."""
    return out.parent / f".{out.name}.shardsmith-lock"


def timed_run(wl: Workload, key: str, clusters: dict[str, Cluster], work: Path, logs: Path, row: Row,
              ref: dict[str, dict[str, str]]) -> None:
    out = work / f"executors-{wl.name}"  # one folder for every row: its path is part of the run identity in the manifest
    scratch = scratch_of(out)
    clear([out, scratch, lock_of(out)])
    warm([str(p) for p in wl.inputs])
    cmd = [sys.executable, "-m", "shardsmith", *wl.args, "-o", str(out), "--quiet", *executor_args(key, clusters)]
    t0 = time.perf_counter()
    watch = Watch(scratch, t0)
    watch.start()
    try:
        wall, _, _ = run_children([cmd], logs / f"{wl.name}-{key}.log", env=child_env(ray=key.startswith("ray")))
    except RuntimeError as e:
        watch.stop()
        row.error = str(e).strip().splitlines()[-1][:160]
        return
    watch.stop()
    row.walls.append(wall)
    row.firsts.append(watch.first if watch.first is not None else float("nan"))  # nan: gone within a poll
    row.parts.append(len(watch.parts))
    row.part_bytes.append(sum(watch.parts.values()))
    row.peaks.append(watch.peak)
    row.out_bytes.append(sum(p.stat().st_size for p in out.rglob("*") if p.is_file()))
    digest = tree_digest(out)
    if key == "local" and wl.name not in ref:
        ref[wl.name] = digest
    if wl.name in ref:
        same = digest == ref[wl.name]
        row.identical = (row.identical is not False) and same
        if not same:
            row.mismatch = ", ".join(sorted(k for k in set(digest) | set(ref[wl.name])
                                            if digest.get(k) != ref[wl.name].get(k))[:4])
    clear([out, scratch, lock_of(out)])


# ---------------------------------------------------------------- the counting pass (--stage processes)

AUDIT = r'''
import atexit, fnmatch, json, os, sys
_opens = {}
def _hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        name = os.path.basename(os.fsdecode(args[0]))
        if fnmatch.fnmatch(name, "part-*.bin"):
            _opens[name] = _opens.get(name, 0) + 1
sys.addaudithook(_hook)
def _report():
    io = {}
    try:
        for line in open("/proc/self/io"):
            k, v = line.split(":")
            io[k] = int(v)
    except OSError:
        pass
    with open(os.environ["BENCH_OPENS_LOG"], "a") as fh:
        fh.write(json.dumps({"argv": sys.argv[1:], "opens": sum(_opens.values()), "files": len(_opens),
                             "rchar": io.get("rchar", 0)}) + "\n")
atexit.register(_report)
_real_exit = os._exit
def _exit(code):  # the CLI ends with os._exit, which skips atexit
    _report()
    _real_exit(code)
os._exit = _exit
import runpy
sys.argv = ["shardsmith", *sys.argv[1:]]
runpy.run_module("shardsmith", run_name="__main__", alter_sys=True)
'''


@dataclass
class Unit:
    stage: str
    rank: int
    wall: float
    opens: int
    files: int
    rchar: int


def counting_pass(wl: Workload, world: int, work: Path, logs: Path) -> tuple[list[Unit], dict]:
    """The job as 2W+1 `--stage` processes with `--workers 1`, opens of part files counted in each."""
    out = work / f"executors-{wl.name}-count{world}"
    scratch = scratch_of(out)
    clear([out, scratch, lock_of(out)])
    warm([str(p) for p in wl.inputs])
    log = logs / f"{wl.name}-count{world}.jsonl"
    log.unlink(missing_ok=True)
    env = {**child_env(), "BENCH_OPENS_LOG": str(log)}
    units: list[Unit] = []
    parts: dict = {}
    for stage in ("scatter", "plan", "gather", "finalize"):
        for rank in range(world if stage not in ("plan", "finalize") else 1):
            cmd = [sys.executable, "-c", AUDIT, *wl.args, "-o", str(out), "--quiet", "--workers", "1",
                   "--stage", stage, "--rank", str(rank), "--world-size", str(world)]
            wall, _, _ = run_children([cmd], logs / f"{wl.name}-count{world}-{stage}-{rank}.log", env=env)
            rec = json.loads(log.read_text().strip().splitlines()[-1])
            units.append(Unit(stage, rank, wall, rec["opens"], rec["files"], rec["rchar"]))
        if stage == "scatter":
            parts = part_facts(scratch)
    clear([out, scratch, lock_of(out)])
    return units, parts


def part_facts(scratch: Path) -> dict:
    """The part files the scatter left: count, bytes, and segments (split, bucket) per part from their footers."""
    from shardsmith.engine.shuffle.partfile import read_footer

    files = sorted(scratch.glob("part-*.bin"))
    index = [read_footer(p, rows=True) for p in files]
    segs = [len(rows) for _, rows in index]
    buckets = {b for _, rows in index for b in rows["bucket"].tolist()}
    footer = [p.stat().st_size - f.layout.index_at for p, (f, _) in zip(files, index)]
    return {"parts": len(files), "bytes": sum(p.stat().st_size for p in files),
            "segments": sum(segs), "buckets": len(buckets), "footer_bytes": sum(footer)}


def table_cost(parts: int = 200, buckets: int = 4096, per_part: int = 2000) -> dict:
    """What tabulating part footers costs a gather unit (and finalize), per segment: every unit reads
    every part's index (``engine/shuffle/segments.split_segments``: binary rows into columns, no object per
    segment), then groups them. Measured here on synthetic parts shaped like the real ones (``per_part``
    non-empty buckets of ``buckets`` in each of ``parts`` parts; payloads as holes), in this process:
    read, table, groups; and the memory the table holds (resident growth)."""
    import tempfile

    import numpy as np

    from shardsmith.engine.shuffle.partfile import FOOTERS, footer_bytes
    from shardsmith.engine.shuffle.segments import split_segments
    from shardsmith.engine.shuffle.split_gather import SplitGather

    rng = np.random.default_rng(0)
    folder = Path(tempfile.mkdtemp(prefix="table-cost-"))
    paths, footer_total = [], 0
    for p in range(parts):
        chosen = np.sort(rng.choice(buckets, per_part, replace=False))
        rows = np.column_stack([np.zeros(per_part, np.int64), chosen, np.arange(per_part) * 3024,
                                np.ones(per_part, np.int64), np.full(per_part, 3000)]).astype(np.uint64)
        footer = footer_bytes(rows, {"task": p, "records": per_part}, payload_end=per_part * 3024)
        path = folder / f"part-{p:06d}.bin"
        with open(path, "wb") as fh:
            fh.truncate(per_part * 3024)
            fh.seek(per_part * 3024)
            fh.write(footer)
        paths.append(str(path))
        footer_total += len(footer)

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    t0 = time.perf_counter()
    for path in paths:
        FOOTERS.footer(path)
    t1 = time.perf_counter()
    table = split_segments(paths, 1)
    t2 = time.perf_counter()
    split = SplitGather.of("train", table[0], budget=1 << 16)
    t3 = time.perf_counter()
    held = rss() - before
    n = parts * per_part
    del table, split
    FOOTERS.forget()
    shutil.rmtree(folder, ignore_errors=True)
    return {"segments": n, "footer_bytes": footer_total, "parse_us": (t1 - t0) / n * 1e6,
            "table_us": (t2 - t1) / n * 1e6, "groups_us": (t3 - t2) / n * 1e6, "bytes_held": held / n}


# ---------------------------------------------------------------- inputs

def ensure_inputs(args: argparse.Namespace) -> list[Workload]:
    from bench_stages import ensure_corpus, ensure_root, ensure_tokenizer

    w = args.workdir
    out = []
    if "tokens" in args.only:
        corpus = ensure_corpus(w, args.mb)
        tok = ensure_tokenizer(w, corpus)
        size = corpus.stat().st_size
        shard_tokens = max(1000, int(size * 0.22 / SHARDS))
        out.append(Workload("tokens", f"pack-tokens, byte-level BPE, {size / 1e6:.0f} MB JSONL ({corpus.name})",
                            ["pack-tokens", str(corpus), "--tokenizer", str(tok), "--shard-tokens", str(shard_tokens)],
                            [corpus, tok], size))
    if "events" in args.only:
        events = max(1000, round(args.events_mb * 1e6 / EVENT_BYTES))
        root = ensure_root(w, events)
        out.append(Workload("events", f"convert ROOT --to hdf5, {events:,} events ({root.name}, "
                            f"{root.stat().st_size / 1e6:.0f} MB)",
                            ["convert", str(root), "--to", "hdf5", "--branches", BRANCHES, "--shard-samples",
                             str(math.ceil(events / SHARDS))], [root], root.stat().st_size))
    return out


def tiny_corpus(w: Path) -> tuple[Path, Path]:
    from bench_stages import ensure_corpus, ensure_tokenizer

    src = ensure_corpus(w, 100)
    tiny = w / "corpus-tiny.jsonl"
    if not tiny.exists():
        with open(src, "rb") as f:
            data = f.read(TINY_BYTES)
        tiny.write_bytes(data[: data.rindex(b"\n") + 1])
    return tiny, ensure_tokenizer(w, src)


# ---------------------------------------------------------------- printing

def report(wl: Workload, rows: dict[str, Row], counts: dict[int, tuple[list[Unit], dict]], repeat: int) -> None:
    print(f"\n{wl.title}")
    print(f"  shardsmith {' '.join(wl.args[:1])} ... -o OUT --quiet  [--workers 2 | --executor E --address A "
          f"--ranks R]; median of {repeat}")
    ref = med(rows["local"].walls) if rows.get("local") and rows["local"].walls else None
    print(f"  {'row':16s} {'wall s':>7s} {'min-max s':>11s} {'x local':>7s} {'1st unit s':>10s} {'parts':>5s} "
          f"{'part MB':>8s} {'scratch peak MB':>15s} {'out MB':>7s}  identical")
    for key, r in rows.items():
        if not r.walls:
            print(f"  {key:16s}  failed: {r.error}")
            continue
        wall = med(r.walls)
        ratio = f"{wall / ref:6.2f}x" if ref else "     -"
        same = {None: "-", True: "yes", False: f"NO ({r.mismatch})"}[r.identical]
        first = med(r.firsts)
        first_s = f"{first:10.2f}" if first == first else f"{'-':>10s}"
        spread = f"{min(r.walls):.2f}-{max(r.walls):.2f}"
        print(f"  {key:16s} {wall:7.2f} {spread:>11s} {ratio:>7s} {first_s} {int(med(r.parts)):5d} "
              f"{med(r.part_bytes) / 1e6:8.1f} {med(r.peaks) / 1e6:15.1f} {med(r.out_bytes) / 1e6:7.1f}  {same}")
    print(f"  input {wl.input_bytes / 1e6:.1f} MB. '1st unit s': when the scratch folder first exists (the first "
          "unit, or the local run, has claimed the output); part MB: the part files scatter wrote to the shared "
          "folder, each read back by the gather")
    goal_rows = [(k, med(r.walls) / ref) for k, r in rows.items() if ref and r.walls and k != "local"]
    if goal_rows:
        worst = max(goal_rows, key=lambda kv: kv[1])
        best_2 = [kv for kv in goal_rows if kv[0].endswith("-2")]
        for k, x in best_2 or [worst]:
            same = {True: ", output identical", False: ", output DIFFERS", None: ""}[rows[k].identical]
            if wl.name == "tiny":  # start-up alone: no goal
                key_figure(f"{k}: a {wl.title}", f"{x:.2f}x the local run's wall{same}")
            else:
                verdict(f"issue 28: {k} within {GOAL}x of the local run ({wl.name})", x <= GOAL, f"{x:.2f}x{same}")
    for world, (units, parts) in sorted(counts.items()):
        by = {s: [u for u in units if u.stage == s] for s in ("scatter", "plan", "gather", "finalize")}
        g = by["gather"]
        print(f"  --stage processes, W={world} (untimed pass, --workers 1, one after another): {parts['parts']} parts, "
              f"{parts['bytes'] / 1e6:.1f} MB, {parts['segments']} segments ({parts['segments'] / max(1, parts['parts']):.0f}"
              f" a part, {parts['buckets']} buckets), footers {parts['footer_bytes'] / 1e3:.1f} kB in all")
        mb = wl.input_bytes / 1e6
        print(f"    unit wall s (start-up included): scatter {' '.join(f'{u.wall:.2f}' for u in by['scatter'])} "
              f"({mb / world / max(u.wall for u in by['scatter']):.0f} MB/s a unit, slowest); gather "
              f"{' '.join(f'{u.wall:.2f}' for u in g)}; plan {by['plan'][0].wall:.2f}; finalize "
              f"{' '.join(f'{u.wall:.2f}' for u in by['finalize'])}")
        print(f"    part-file opens per gather rank: {' '.join(str(u.opens) for u in g)} (distinct parts "
              f"{' '.join(str(u.files) for u in g)}); plan {by['plan'][0].opens}; finalize {by['finalize'][0].opens}; read calls returned per "
              f"gather rank (rchar, all files) MB: {' '.join(f'{u.rchar / 1e6:.1f}' for u in g)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1000, help="input size, 10**6 B, of each workload (default 1000)")
    ap.add_argument("--events-mb", type=float, default=None, help="size of the ROOT input (default: --mb)")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--executors", default="local,dask,ray")
    ap.add_argument("--only", default="tokens,events")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-count", action="store_true", help="skip the counting pass of --stage processes")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench"))
    args = ap.parse_args(argv)
    args.events_mb = args.events_mb or args.mb
    args.only = [s for s in args.only.split(",") if s]
    executors = [s for s in args.executors.split(",") if s]
    ranks = [int(x) for x in args.ranks.split(",") if x]

    if "ray" in executors and not loopback_only() and os.environ.get(NETNS_ENV) != "1":
        if os.geteuid() == 0 and shutil.which("unshare"):
            inner = shlex.join([sys.executable, *sys.argv])
            os.execvpe("unshare", ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {inner}"],
                       {**os.environ, NETNS_ENV: "1"})
        print("Ray needs a loopback-only network namespace (root and unshare): Ray rows skipped")

    args.workdir = args.workdir.resolve()
    logs = args.workdir / "logs-executors"
    logs.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    print(f"shardsmith executors benchmark: {os.cpu_count()} cores, ranks {ranks}, executors {executors}, "
          f"network namespace: {'loopback only' if loopback_only() else 'the machine'}; load average {load()}")
    version = code_version()
    print(f"shardsmith under test: {version}; byte-compiled {byte_compiled()}")
    wls = ensure_inputs(args)
    tiny, tok = tiny_corpus(args.workdir)

    _become_subreaper()
    clusters: dict[str, Cluster] = {}
    try:
        for name, start in (("dask", start_dask), ("ray", start_ray)):
            if name in executors:
                clusters[name] = start(logs)
        print("\nstart-up")
        for name, c in clusters.items():
            if c.error:
                print(f"  {name}: {c.error}")
                continue
            p = [probe(name, c.address, logs / f"{name}-probe.log") for _ in range(max(3, args.repeat))]
            print(f"  {name}: cluster up in {c.startup_s:.1f} s (start to 2 workers answering; once per cluster); a "
                  f"fresh process: import {med([x['import'] for x in p]):.2f} s, connect "
                  f"{med([x['connect'] for x in p]):.2f} s, one trivial task {med([x['task'] for x in p]):.3f} s, "
                  f"process wall {med([x['wall'] for x in p]):.2f} s (median of {len(p)})")
        live = [k for k in executors if k == "local" or not clusters.get(k, Cluster(k, error="?")).error]
        tiny_wl = Workload("tiny", f"pack-tokens of {TINY_BYTES // 1000} kB (start-up)",
                           ["pack-tokens", str(tiny), "--tokenizer", str(tok), "--shard-tokens", "100000"],
                           [tiny, tok], tiny.stat().st_size)
        keys_tiny = [k if k == "local" else f"{k}-2" for k in live]
        rows_tiny = {k: Row(k) for k in keys_tiny}
        ref: dict[str, dict[str, str]] = {}
        for _ in range(max(3, args.repeat)):
            for k in keys_tiny:
                timed_run(tiny_wl, k, clusters, args.workdir, logs, rows_tiny[k], ref)
        report(tiny_wl, rows_tiny, {}, max(3, args.repeat))

        for wl in wls:
            keys = ["local"] * ("local" in executors) + [f"{e}-{r}" for r in ranks for e in live if e != "local"]
            rows = {k: Row(k) for k in keys}
            for _ in range(args.repeat):
                for k in keys:
                    timed_run(wl, k, clusters, args.workdir, logs, rows[k], ref)
            counts = {} if args.no_count else {w: counting_pass(wl, w, args.workdir, logs) for w in ranks}
            report(wl, rows, counts, args.repeat)
    finally:
        stop_all(list(clusters.values()))
    t = table_cost()
    print(f"\npart footers tabulated by the plan unit (engine/shuffle/run.split_tables; synthetic, "
          f"{t['segments']:,} segments, {t['footer_bytes'] / t['segments']:.0f} B of footer JSON each): parse "
          f"{t['parse_us']:.2f} us, table {t['table_us']:.2f} us, groups {t['groups_us']:.2f} us a segment; "
          f"{t['bytes_held']:.0f} B held a segment")
    if code_version() != version:
        print(f"\nWARNING: the code changed during the run ({version} -> {code_version()}): rows mix versions")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load average at the end: {load()} (1, 5, 15 min; "
          "anything else running on this machine skews the figures)")


if __name__ == "__main__":
    main()
