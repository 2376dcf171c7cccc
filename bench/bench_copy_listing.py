"""The copy mode's memory against the file count: `convert --to webdataset` of a synthetic image
tree (tiny files, `--check-images none`: the listing side is what is measured), peak RSS of the
parent process and wall time, for this checkout and another one side by side.

    .venv/bin/python bench/bench_copy_listing.py --files 100000 1000000 --old /path/to/checkout-of-8ac82ac

The tree is made once per size under --tmp (1,000 class folders, 118-byte files) and kept for the
next run; each conversion runs in a fresh interpreter, which prints its own ``ru_maxrss`` as it leaves
(the parent alone: not the listing child nor the workers). Shards of 10,000 files, about what a 1 GB
shard of ImageNet holds: a shard's files are held while it is written (the format writes a shard
from its list of files), so tiny files in one huge shard would measure that, not the listing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLASSES = 1000
DATA = b"\xff\xd8\xff\xe0" + bytes(110) + b"\xff\xd9"  # a JPEG's first and last bytes: tiny, never decoded
PROBE = ("import os, resource, sys\n"
         "parent, leave = os.getpid(), os._exit\n"
         "def _exit(code):\n"  # the command line leaves with os._exit (no atexit): the parent says its peak first
         "    if os.getpid() == parent:\n"
         "        print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr, flush=True)\n"
         "    leave(code)\n"
         "os._exit = _exit\n"
         "sys.argv = ['shardsmith', *sys.argv[1:]]\n"
         "from shardsmith.program import main\n"
         "main()\n")


def tree(root: Path, files: int) -> Path:
    """``files`` tiny images in ``CLASSES`` class folders (made once)."""
    done = root / f"tree-{files}"
    if (done / ".complete").exists():
        return done
    shutil.rmtree(done, ignore_errors=True)
    for c in range(CLASSES):
        folder = done / f"n{c:05d}"
        folder.mkdir(parents=True)
        for i in range(c, files, CLASSES):
            fd = os.open(folder / f"img_{i:08d}.jpg", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, DATA)
            os.close(fd)
    (done / ".complete").touch()
    return done


def convert(checkout: Path, folder: Path, out: Path, workers: int) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the command and its workers, the parent's peak RSS in MB) of
    one conversion with ``checkout``'s code."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", PROBE, "convert", str(folder), "-o", str(out), "--to", "webdataset",
                          "--check-images", "none", "--workers", str(workers), "--shard-samples", "10000", "-q"],
                         env=env, capture_output=True, text=True, check=False,
                         cwd=out.parent)  # (not a checkout: ``-c`` puts the working folder first on sys.path)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if res.returncode:
        raise SystemExit(res.stderr[-3000:])
    rss = next(int(line.split()[1]) for line in res.stderr.splitlines() if line.startswith("MAXRSS"))
    shutil.rmtree(out, ignore_errors=True)
    return wall, cpu, rss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, nargs="+", default=[100_000])
    ap.add_argument("--old", type=Path, help="a checkout to compare with (e.g. a worktree of 8ac82ac)")
    ap.add_argument("--tmp", type=Path, default=Path("/tmp/ss-copylist"))
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    runs = [("this", REPO)] + ([("old", args.old.resolve())] if args.old else [])
    print(f"{'files':>9} | {'code':<5} | {'wall s':>7} | {'CPU s':>7} | {'peak RSS MB':>11}")
    for n in args.files:
        folder = tree(args.tmp, n)
        for name, checkout in runs:
            wall, cpu, rss = convert(checkout, folder, args.tmp / "out", args.workers)
            print(f"{n:>9,} | {name:<5} | {wall:>7.2f} | {cpu:>7.2f} | {rss:>11,.0f}", flush=True)


if __name__ == "__main__":
    main()
