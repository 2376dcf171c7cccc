"""``convert --to memmap``, two checkouts side by side (the memmap format's own events encoder: each
event cut to its row in the workers, against records decoded and padded in the one writer of a split).

    python bench/ab_memmap.py --base /path/to/old/checkout [--new .] [--events 200000] [--mean-pulses 40]
                              [--max-len 64] [--repeat 5] [-- --dtype float16 --keep top:pulses_charge]

One synthetic IceCube-like ROOT file (``make_icecube_like``, cached in the workdir), the 5 pulse fields
and 3 event scalars, ``--workers 2``; the runs alternate between the checkouts (each with ``PYTHONPATH``
set to it, under this interpreter) so both see the same load. Prints each one's median wall time, CPU
time (user and system, every process of the run: steadier than wall time on a loaded machine), the
scatter's and the gather's (convert's own ``convert:`` and ``gather:`` lines), and whether both wrote
the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BRANCHES = "pulses_time,pulses_charge,pulses_dom_x,pulses_dom_y,pulses_dom_z,event_id,azimuth,zenith"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, default=HERE.parent)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--mean-pulses", type=float, default=40)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench/ab-memmap"))
    ap.add_argument("extra", nargs="*", help="more convert options, after --")
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    src = a.workdir / f"icecube-{a.events}-{a.mean_pulses:g}.root"
    if not src.is_file():
        from shardsmith.demo.root_files import make_icecube_like

        make_icecube_like(src, events=a.events, mean_pulses=a.mean_pulses, seed=0)
    src.read_bytes()  # in the page cache, for both alike
    trees = {"base": a.base.resolve(), "new": a.new.resolve()}
    times: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in trees}
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for i in range(a.repeat):
        for name in (["base", "new"] if i % 2 == 0 else ["new", "base"]):
            out = a.workdir / name
            shutil.rmtree(out, ignore_errors=True)
            t0, c0 = time.perf_counter(), _cpu()
            r = subprocess.run([sys.executable, "-m", "shardsmith", "convert", str(src), "-o", str(out), "--to", "memmap",
                                "--max-len", str(a.max_len), "--branches", BRANCHES, *a.extra],
                               env={**os.environ, "PYTHONPATH": str(trees[name])}, cwd=trees[name],  # -m puts the cwd first
                               capture_output=True, text=True, check=True)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            said = r.stdout + r.stderr
            stage = [float(re.search(rf"{w}: .*, ([0-9.]+) s", said).group(1)) for w in ("convert", "gather")]  # type: ignore[union-attr]
            times[name].append((wall, cpu, *stage))  # type: ignore[arg-type]
    for name, runs in times.items():
        wall, cpu, scatter, gather = (statistics.median(r[k] for r in runs) for k in range(4))
        print(f"  {name:5s} wall {wall:5.2f} s, cpu {cpu:5.2f} s, scatter {scatter:4.1f} s, gather {gather:4.1f} s  "
              f"({trees[name]})")
    digests = [{p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (a.workdir / n).glob("*.bin")} for n in trees]
    print(f"  new/base wall {statistics.median(r[0] for r in times['new']) / statistics.median(r[0] for r in times['base']):.2f}; "
          f"same arrays: {digests[0] == digests[1]}; load average at end: {os.getloadavg()[0]:.2f}")


def _cpu() -> float:
    """User and system seconds of the children waited for so far (the run's processes, workers included)."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


if __name__ == "__main__":
    main()
