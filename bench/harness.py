"""What every side-by-side benchmark here shares: warming the page cache, running and timing
child processes, naming the code under test, and printing verdicts."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def clear(paths: list[Path] | tuple[Path, ...]) -> None:
    """Remove a previous run's output (folders or files) before a timed run."""
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def warm(paths: list[str]) -> dict:
    """Read every file under `paths` (folders walked) once; returns the byte count."""
    n = size = 0
    for p in paths:
        files = [p] if os.path.isfile(p) else [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs]
        for f in files:
            with open(f, "rb") as fh:
                while block := fh.read(1 << 22):
                    size += len(block)
            n += 1
    return {"files": n, "bytes": size}


def code_version() -> str:
    """The commit of the shardsmith under test, plus a digest of shardsmith/*.py as they are on disk
    (other work may edit the tree while the benchmark runs)."""
    import hashlib

    repo = HERE.parent
    digest = hashlib.sha256()
    for path in sorted((repo / "shardsmith").rglob("*.py")):
        digest.update(path.read_bytes())
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "shardsmith"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head, dirty = "?", ""
    return f"commit {head}{' (+ uncommitted changes)' if dirty else ''}, sources {digest.hexdigest()[:12]}"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as a benchmark prints them beside its figures."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def started(what: str) -> str:
    """Print what is benchmarked, on how many cores, at what load, and which shardsmith; returns
    the version (``code_version``) to hand to ``ended``."""
    print(f"{what}, {os.cpu_count()} cores, load average {load_average()}")
    version = code_version()
    print(f"shardsmith under test: {version}; byte-compiled {byte_compiled()}")
    return version


def ended(version: str, t0: float) -> None:
    """Say whether the code changed while the benchmark ran (its rows would mix versions), and the
    run's time and load at its end."""
    if code_version() != version:
        print(f"\nWARNING: the code changed during the run ({version} -> {code_version()}): rows mix versions")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; load average at the end {load_average()}")


ANCHOR_PY = HERE / ".venv-anchors" / "bin" / "python"


def anchor_python(module: str) -> str | None:
    """The interpreter that runs a peer tool: bench/.venv-anchors (bench/anchors/setup.sh) if it has
    `module`, else this one if it has it (megatron-core comes with the project's dev venv), else None:
    the tool is not installed here and its rows say so."""
    import sys

    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    for python in (ANCHOR_PY, Path(sys.executable)):
        if python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0:
            return str(python)
    return None


NOT_INSTALLED = "not installed here (bash bench/anchors/setup.sh)"


def comparable(name: str, data: bytes) -> bytes:
    """A dataset file's bytes less what names the run that wrote it: manifest.json without `created`,
    `command` and `run` (its identity), the README.md card without its "## Command" section (the
    command line names the output). Two runs of a job into different outputs (a folder and s3://, one
    process and W ranks) must agree on the rest."""
    if name == "manifest.json":
        manifest = json.loads(data)
        for key in ("created", "command", "run"):
            manifest.pop(key, None)
        return json.dumps(manifest, sort_keys=True).encode()
    if name == "README.md":
        return re.sub(rb"## Command\n\n```\n.*?\n```\n", b"", data, flags=re.S)
    return data


def verdict(label: str, ok: bool, detail: str) -> None:
    print(f"  {'PASS' if ok else 'FAIL'}  {label}: {detail}")


KEY = "  KEY   "  # the prefix of a headline figure's line: bench/suite.py shows these lines in its table


def key_figure(label: str, value: str) -> None:
    """Print one headline figure (a ratio to the peer tool or the limit) of a benchmark without a
    PASS/FAIL goal, so that `make bench` can show it beside the verdicts of the others."""
    print(f"{KEY}{label}: {value}")


def run_children(cmds: list[list[str]], log: Path, env: dict[str, str] | None = None
                 ) -> tuple[float, float, list[str]]:
    """Run ``cmds`` side by side: wall seconds until the last exits, user + system CPU seconds of
    the children (and their reaped descendants), and each one's stdout; stderr goes to ``log``.
    A child that fails raises, with the tail of the log."""
    with open(log, "wb") as err:
        t0 = time.perf_counter()
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env) for cmd in cmds]
        outs = [p.stdout.read().decode() for p in procs]
        cpu, codes = 0.0, []
        for p in procs:
            _, status, usage = os.wait4(p.pid, 0)
            cpu += usage.ru_utime + usage.ru_stime
            codes.append(os.waitstatus_to_exitcode(status))
        wall = time.perf_counter() - t0
    if any(codes):
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(map(str, cmds[0]))} exited {max(codes, key=abs)}; stderr tail:\n{tail}")
    return wall, cpu, outs


def last_json(out: str) -> dict:
    """The last JSON object line a child printed (children report their own measures so)."""
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def median_time(fn, repeat: int) -> float:
    """The median wall time of ``fn()`` over ``repeat`` calls (seconds)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


_PROC_FILE = {"VmRSS:": "status", "Pss:": "smaps_rollup"}  # where /proc/PID gives each of tree_memory_kb's keys


def tree_memory_kb(pid: int, *, keys: tuple[str, ...] = ("VmRSS:",)) -> list[int]:
    """Each of ``keys`` summed (kB) over `pid` and all its descendants (children of every thread), in
    one walk of /proc: ``VmRSS:`` from status, ``Pss:`` from smaps_rollup. Pss counts a page shared by
    forked workers (the parent's memory they inherit copy-on-write, the page cache they map) once,
    where VmRSS counts it in every process that maps it."""
    totals, stack = [0] * len(keys), [pid]
    while stack:
        p = stack.pop()
        try:
            for i, key in enumerate(keys):
                text = Path(f"/proc/{p}/{_PROC_FILE[key]}").read_text()
                totals[i] += sum(int(line.split()[1]) for line in text.splitlines() if line.startswith(key))
            for task in os.listdir(f"/proc/{p}/task"):
                stack += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
    return totals


def tree_rss_kb(pid: int) -> int:
    """Summed VmRSS (kB) of `pid` and all its descendants."""
    return tree_memory_kb(pid)[0]


def byte_compiled() -> Path:
    """Byte-compile the shardsmith package that children import (``__pycache__``, as ``pip install``
    does) and return its folder. An editable install run with PYTHONDONTWRITEBYTECODE=1 (as on the
    helpers' machine) never writes .pyc: every child would compile ~150 modules from source, 0.1-0.2 s
    of each process's start-up that an installed shardsmith does not pay."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("shardsmith")
    assert spec is not None and spec.origin is not None
    folder = Path(spec.origin).parent
    compileall.compile_dir(str(folder), quiet=1)
    return folder


def nanogpt_get_batch(train_bin: Path, *, block: int, batch: int, data: object = None) -> None:
    """nanoGPT train.py's ``get_batch``, the peer of ``TokenDataset.get_batch``: the uint16 memmap
    re-created for every batch, as in it (``data`` None), or the one given (opened once)."""
    import numpy as np
    import torch

    data = np.memmap(train_bin, dtype=np.uint16, mode="r") if data is None else data
    ix = torch.randint(len(data) - block, (batch,))  # type: ignore[arg-type]
    torch.stack([torch.from_numpy((data[i:i + block]).astype(np.int64)) for i in ix])  # type: ignore[index]
    torch.stack([torch.from_numpy((data[i + 1:i + 1 + block]).astype(np.int64)) for i in ix])  # type: ignore[index]
