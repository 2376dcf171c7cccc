"""Rows into Lance: ``convert --to lance`` against the script a user writes with pylance instead.

    python bench/bench_lance_out.py [--mb 100] [--images 4000] [--workers 2] [--repeat 1]
                                    [--workdir /tmp/shardsmith-bench/lance_out]

Rows: bench_parquet_out.py's synthetic JSONL file of --mb MB (its generator; made once, cached in the
workdir, read once first so that every run finds it in the page cache):
  - ``shardsmith``: ``convert --to lance`` (exact global shuffle, typed columns, text zstd, sha256 of
    every file, fsync, a table of the same bytes for the same rows, manifest and card), wall s;
  - ``pylance``: ``pyarrow.json.read_json``, the rows shuffled (``take`` of a seeded permutation) and
    ``lance.write_dataset`` (data file format 2.1, shardsmith's), fsync of its files, in one process:
    no hash, no resume, no manifest, bytes that change from run to run (FSST, the clock, UUIDs);
  - ``disk``: writing shardsmith's output files from memory, each fsynced: what no converter beats.
Images (--images N, 0 to skip): an ImageFolder of N JPEGs (``images.py``: ~27 KB each, 100 classes),
``convert --to lance`` against reading the files in a seeded random order and ``lance.write_dataset``
of a table of their bytes and class, fsynced; and the disk's limit the same way.
Each runs as a child process (start-up included), its output removed before (not timed); the median
of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_parquet_out import make_jsonl  # noqa: E402  (the same rows as --to parquet's bench)
from harness import clear, ended, key_figure, started, warm  # noqa: E402
from images import ensure_imagefolder  # noqa: E402

FSYNC = """
def fsync_tree(out):
    for folder, _, files in os.walk(out):
        for f in files:
            fd = os.open(os.path.join(folder, f), os.O_RDONLY); os.fsync(fd); os.close(fd)
"""

ROWS = """
import os, sys, numpy as np, pyarrow.json as pj, lance
src, out = sys.argv[1], sys.argv[2]
table = pj.read_json(src)
table = table.take(np.random.default_rng(0).permutation(table.num_rows))
lance.write_dataset(table, out, data_storage_version="2.1")
""" + FSYNC + "fsync_tree(out)\n"

IMAGES = """
import os, sys, numpy as np, pyarrow as pa, lance
src, out = sys.argv[1], sys.argv[2]
classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
paths, labels = [], []
for c, name in enumerate(classes):
    names = sorted(os.listdir(os.path.join(src, name)))
    paths += [os.path.join(src, name, f) for f in names]
    labels += [c] * len(names)
order = np.random.default_rng(0).permutation(len(paths))
images = []
for i in order:
    with open(paths[i], "rb") as fh:
        images.append(fh.read())
table = pa.table({"image": pa.array(images, pa.binary()), "label": pa.array(np.asarray(labels)[order], pa.int32())})
lance.write_dataset(table, out, data_storage_version="2.1")
""" + FSYNC + "fsync_tree(out)\n"

# the output's files read into memory first (not timed), then each written and fsynced: prints the seconds
DISK = """
import os, sys, time
src, out = sys.argv[1], sys.argv[2]
files = []
for folder, _, names in os.walk(src):
    for f in names:
        with open(os.path.join(folder, f), "rb") as fh:
            files.append(fh.read())
os.makedirs(out)
t0 = time.perf_counter()
for k, data in enumerate(files):
    with open(os.path.join(out, str(k)), "wb") as fh:
        fh.write(data); fh.flush(); os.fsync(fh.fileno())
print(time.perf_counter() - t0)
"""


def timed(cmd: list[str], out: Path, repeat: int) -> float:
    """The median wall time of a child command, ``out`` removed before each run (not timed)."""
    times = []
    for _ in range(repeat):
        clear([out])
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def disk_time(src: Path, out: Path, repeat: int) -> float:
    """The median time of writing ``src``'s files from memory, each fsynced."""
    times = []
    for _ in range(repeat):
        clear([out])
        child = subprocess.run([sys.executable, "-c", DISK, str(src), str(out)], check=True, capture_output=True,
                               text=True)
        times.append(float(child.stdout.split()[-1]))
    clear([out])
    return statistics.median(times)


def size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def compare(label: str, src: Path, size: float, ours_cmd: list[str], ours_out: Path, peer_cmd: list[str],
            peer_out: Path, peer_label: str, a: argparse.Namespace) -> None:
    """One case: shardsmith, the pylance script and the disk's limit, printed with the ratios."""
    ours = timed(ours_cmd, ours_out, a.repeat)
    peer = timed(peer_cmd, peer_out, a.repeat)
    disk = disk_time(ours_out / "train.lance", a.workdir / "disk", a.repeat)
    print(f"\n{label}: {size:,.0f} MB of input; median of {a.repeat}, load average now "
          f"{os.getloadavg()[0]:.2f}")
    print(f"  {f'shardsmith --to lance (--workers {a.workers})':46s} {ours:6.2f} s  "
          f"{size_mb(ours_out / 'train.lance'):6.1f} MB written")
    print(f"  {'pylance: ' + peer_label:46s} {peer:6.2f} s  {size_mb(peer_out):6.1f} MB written")
    print(f"  {'disk: those files from memory, each fsynced':46s} {disk:6.2f} s")
    print(f"  shardsmith / pylance = {ours / peer:.2f}x, shardsmith / disk = {ours / disk:.1f}x")
    key_figure(f"convert --to lance, {label}", f"{ours:.1f} s for {size:,.0f} MB, {ours / peer:.2f}x "
               f"pylance's {peer_label}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--images", type=int, default=4000, help="JPEGs in the image case (0: skip it)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench/lance_out"))
    a = p.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    version = started("convert --to lance against pylance's write_dataset")
    py = sys.executable
    ss = [py, "-m", "shardsmith", "convert"]
    common = ["--to", "lance", "--overwrite", "-q", "--workers", str(a.workers)]

    src = a.workdir / f"rows-{a.mb}mb.jsonl"
    if not src.is_file():
        make_jsonl(src, a.mb)
    warm([str(src)])
    out = a.workdir / "rows-out"
    compare("rows", src, src.stat().st_size / 1e6, [*ss, str(src), "-o", str(out), *common], out,
            [py, "-c", ROWS, str(src), str(a.workdir / "rows-pylance.lance")], a.workdir / "rows-pylance.lance",
            "read_json + take + write_dataset", a)

    if a.images:
        folder = a.workdir / f"images-{a.images}"
        info = ensure_imagefolder(folder, a.images)
        warm([str(folder)])
        out = a.workdir / "images-out"
        compare("images", folder, info["bytes"] / 1e6, [*ss, str(folder), "-o", str(out), *common], out,
                [py, "-c", IMAGES, str(folder), str(a.workdir / "images-pylance.lance")],
                a.workdir / "images-pylance.lance", "read files + write_dataset", a)
    ended(version, t0)


if __name__ == "__main__":
    main()
