"""Where a conversion's time, memory and disk go (issue 31): one run of a shardsmith command with its
engine's phases stamped, and its process tree's memory sampled from ``smaps_rollup``.

    python bench/profile_events.py OUT -- convert IN.root -o OUT --to hdf5 ... [--workers 2]

Prints each phase's wall time (scatter, the split tables, the plan, the gather, finishing, the
spill's removal), the shuffle's shape (buckets, part files, segments per bucket and per part, bytes
per segment, groups), and at the peak of the tree's summed PSS each process's PSS split into
anonymous, file-mapped and shmem pages (parent and each worker), with the output's and spill's
disk use and the page cache then. A 0.25 s sampler: the peak it sees is a lower bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")


def _rollup(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            out[key] = int(rest.split()[0])
    return out


def tree(pid: int) -> list[tuple[int, int, dict[str, int]]]:
    """(pid, depth, rollup kB) of ``pid`` and its descendants."""
    rows, stack = [], [(pid, 0)]
    while stack:
        p, depth = stack.pop()
        try:
            rows.append((p, depth, _rollup(p)))
            for task in os.listdir(f"/proc/{p}/task"):
                stack += [(int(c), depth + 1) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError, PermissionError):
            pass
    return rows


def du(paths: list[Path]) -> int:
    total = 0
    for root in paths:
        for folder, _, files in os.walk(root):
            for f in files:
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(folder, f)).st_blocks * 512
    return total


def meminfo() -> dict[str, int]:
    return {ln.split(":")[0]: int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
            if ln.split(":")[0] in ("Cached", "Dirty", "MemAvailable")}


def watch(out: Path, argv: list[str]) -> None:
    stamps = out.parent / f"{out.name}.phases.jsonl"
    stamps.unlink(missing_ok=True)
    env = {**os.environ, "PROFILE_STAMPS": str(stamps)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--run", *argv], env=env)
    peak: dict = {"pss": 0}
    peak_disk = [0, 0.0]
    done = threading.Event()
    timeline = []

    def sample() -> None:
        n = 0
        while not done.wait(0.25):
            rows = tree(proc.pid)
            pss = sum(r[2].get("Pss", 0) for r in rows)
            if pss > peak["pss"]:
                peak.update(pss=pss, t=time.perf_counter() - t0, rows=rows, mem=meminfo())
            if n % 4 == 0:
                disk = du([out, out.parent / f".{out.name}.shardsmith-work"])
                if disk > peak_disk[0]:
                    peak_disk[:] = [disk, time.perf_counter() - t0]
                timeline.append((round(time.perf_counter() - t0, 1), pss // 1024, disk // 2**20))
            n += 1

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    code = proc.wait()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    print(f"exit {code}, wall {wall:.1f} s, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if stamps.exists():
        for line in stamps.read_text().splitlines():
            print("  " + line)
    print(f"peak disk (output + spill) {peak_disk[0] / 1e9:.2f} GB at {peak_disk[1]:.0f} s")
    if peak.get("rows"):
        print(f"peak PSS {peak['pss'] / 1024:,.0f} MB at {peak['t']:.1f} s; page cache {peak['mem']['Cached'] // 1024:,} MB, "
              f"dirty {peak['mem']['Dirty'] // 1024:,} MB, available {peak['mem']['MemAvailable'] // 1024:,} MB")
        for pid, depth, r in sorted(peak["rows"], key=lambda x: (x[1], x[0])):
            print(f"  {'parent' if depth == 0 else 'worker':6s} {pid:7d}: " +
                  ", ".join(f"{k} {r.get(k, 0) / 1024:,.0f}" for k in FIELDS) + " MB")
    print("timeline (s, PSS MB, disk MB): " + " ".join(f"{t}/{p}/{d}" for t, p, d in timeline[::max(1, len(timeline) // 40)]))


# ------------------------------------------------------------------ in the profiled process

def disk_io_mb() -> tuple[int, int]:
    """MB read and written so far by the machine's disks (/proc/diskstats, whole disks only)."""
    read = written = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if re.fullmatch(r"(vd|sd|xvd)[a-z]+|nvme\d+n\d+", f[2]):
            read, written = read + int(f[5]) * 512, written + int(f[9]) * 512
    return read >> 20, written >> 20


def _stamp(record: dict) -> None:
    record["disk_read_mb"], record["disk_written_mb"] = disk_io_mb()
    record["cached_mb"] = meminfo()["Cached"] >> 10
    with open(os.environ["PROFILE_STAMPS"], "a") as fh:
        fh.write(json.dumps(record) + "\n")


def _timed(module, name: str, describe=None) -> None:
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        result = inner(*args, **kwargs)
        record = {"phase": name, "s": round(time.perf_counter() - t, 2)}
        if describe is not None:
            record.update(describe(args, kwargs, result))
        _stamp(record)
        return result

    setattr(module, name, wrapper)


def _shape(args, kwargs, splits) -> dict:
    job = args[0]
    out = {"buckets": job.n_buckets, "parts": len(args[1])}
    for s in splits:
        sizes = sorted(s.segments.nbytes.tolist())
        out[s.name] = {"samples": s.samples, "groups": s.groups, "segments": len(s.segments),
                       "segments_per_group": round(len(s.segments) / max(1, s.groups)),
                       "median_segment_bytes": sizes[len(sizes) // 2] if sizes else 0,
                       "mean_segment_samples": round(s.samples / max(1, len(s.segments)), 1),
                       "mean_group_bytes": sum(sizes) // max(1, s.groups)}
    return out


def run(argv: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shardsmith beside this bench, not an installed one
    from shardsmith.engine.shuffle import gather
    from shardsmith.engine.shuffle import run as engine_run

    _timed(engine_run, "run_scatter")
    _timed(engine_run, "split_tables", _shape)
    _timed(gather, "plan_split", lambda a, k, plan: {"shards": plan.shards})
    _timed(gather, "write_ranges")
    _timed(engine_run, "finish")
    from shardsmith.engine.output import session

    _timed(session, "finish_output")  # the spill's removal, after the manifest
    from shardsmith.cli import main

    sys.argv = ["shardsmith", *argv]
    _stamp({"phase": "start"})
    t = time.perf_counter()
    try:
        main()
    finally:
        _stamp({"phase": "command", "s": round(time.perf_counter() - t, 2)})


if __name__ == "__main__":
    if sys.argv[1] == "--run":
        run(sys.argv[2:])
    else:
        sep = sys.argv.index("--")
        watch(Path(sys.argv[1]).resolve(), sys.argv[sep + 1:])
