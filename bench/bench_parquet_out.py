"""Rows into Parquet: ``convert --to parquet`` against the script a user writes with pyarrow instead.

    python bench/bench_parquet_out.py [--mb 100] [--workers 2] [--repeat 1] [--workdir /tmp/shardsmith-bench/parquet_out]

On one synthetic JSONL file of --mb MB (text of 100-2,000 characters, an int, a float, a list of tags, an
object in one row of five; made once, cached in the workdir, read once first so that both runs find it in
the page cache):
  - ``shardsmith``: ``convert --to parquet`` (exact global shuffle, typed columns, zstd, sha256 of every file,
    fsync, manifest and card), wall s;
  - ``pyarrow``: ``pyarrow.json.read_json``, the rows shuffled (``take`` of a seeded permutation) and
    ``pyarrow.parquet.write_table`` with zstd, fsync, in one process: no hash, no resume, no manifest.
Each runs as a child process (start-up included); the median of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import key_figure, median_time  # noqa: E402

PYARROW = """
import os, sys, numpy as np, pyarrow.json as pj, pyarrow.parquet as pq
src, out = sys.argv[1], sys.argv[2]
table = pj.read_json(src)
table = table.take(np.random.default_rng(0).permutation(table.num_rows))
pq.write_table(table, out, compression="zstd")
fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)
"""

WORDS = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which"]


def make_jsonl(path: Path, mb: int) -> int:
    """About ``mb`` MB of rows; the number written."""
    rng = random.Random(0)
    n = 0
    with open(path, "w") as fh:
        while fh.tell() < mb * 1_000_000:
            row = {"id": n, "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 400))),
                   "score": rng.random(), "tags": [rng.choice(WORDS) for _ in range(rng.randint(0, 4))]}
            if n % 5 == 0:
                row["meta"] = {"source": f"site{n % 17}", "rank": n % 100}
            fh.write(json.dumps(row) + "\n")
            n += 1
    return n


def timed(cmd: list[str], repeat: int) -> float:
    return median_time(lambda: subprocess.run(cmd, check=True, capture_output=True), repeat)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench/parquet_out"))
    a = p.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    src = a.workdir / f"rows-{a.mb}mb.jsonl"
    if not src.is_file():
        make_jsonl(src, a.mb)
    src.read_bytes()  # in the page cache, for both alike
    py = sys.executable
    out = a.workdir / "out"
    ours = timed([py, "-m", "shardsmith", "convert", str(src), "-o", str(out), "--to", "parquet", "--overwrite",
                  "-q", "--workers", str(a.workers)], a.repeat)
    peer_out = a.workdir / "pyarrow.parquet"
    peer = timed([py, "-c", PYARROW, str(src), str(peer_out)], a.repeat)
    ours_mb = sum(f.stat().st_size for f in out.glob("*.parquet")) / 1e6
    print(f"{src.stat().st_size / 1e6:,.0f} MB of JSONL; median of {a.repeat}, {os.cpu_count()} cores")
    print(f"  shardsmith --to parquet (--workers {a.workers}) {ours:6.2f} s  {ours_mb:6.1f} MB written")
    print(f"  pyarrow read_json + take + write_table     {peer:6.2f} s  {peer_out.stat().st_size / 1e6:6.1f} MB written")
    print(f"  shardsmith / pyarrow = {ours / peer:.2f}x; load average at end: {os.getloadavg()[0]:.2f}")
    key_figure("convert --to parquet", f"{ours:.1f} s for {src.stat().st_size / 1e6:,.0f} MB of JSONL, "
               f"{ours / peer:.2f}x pyarrow's read_json + shuffle + write_table")


if __name__ == "__main__":
    main()
