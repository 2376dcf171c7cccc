"""MDS output: ``convert --to mds`` against ``streaming.MDSWriter``, the tool a user of MosaicML Streaming picks.

    python bench/bench_mds_out.py [--rows 200000] [--workers 2] [--repeat 1] [--workdir /tmp/shardsmith-bench/mds]

The same JSONL rows (an int id, a text of ~60 words, a float, a list: the columns MDSWriter is told,
``int``/``str``/``float64``/``json``), 64 MiB shards (MDSWriter's default size):
  - ``MDSWriter``: read the lines (orjson), write each row with ``MDSWriter.write``, one process, in the
    file's order: no shuffle, no hash beyond the index, no fsync, no resume;
  - ``shardsmith``: ``convert --to mds --shard-bytes 64MiB`` (exact global shuffle, sha256 of every file,
    fsync, manifest and card, resumable), with --workers.
Each runs as a child process (start-up included); the median of --repeat runs, the input read once first.
mosaicml-streaming must be installed (``pip install --no-deps mosaicml-streaming`` and its small
imports: brotli, python-snappy, zstd, catalogue; its release pins numpy and transformers below ours).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import key_figure, median_time  # noqa: E402

# streaming imports its vision datasets (torchvision) first; where torchvision cannot load beside our
# torch, that subpackage is stood in for: MDSWriter does not use it
WRITER = """
import importlib.util, sys, types
import orjson
try:
    import streaming
except (ImportError, RuntimeError):
    for m in [m for m in sys.modules if m == "streaming" or m.startswith(("streaming.", "torchvision"))]:
        del sys.modules[m]
    sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    import streaming
if len(sys.argv) < 3:
    sys.exit()  # the import alone (context: what a user's script pays before its first row)
src, out = sys.argv[1], sys.argv[2]
columns = {"id": "int", "text": "str", "score": "float64", "tags": "json"}
with streaming.MDSWriter(out=out, columns=columns, size_limit=1 << 26) as w, open(src, "rb") as f:
    for line in f:
        w.write(orjson.loads(line))
"""

WORDS = ("the", "of", "shard", "token", "model", "data", "order", "sample", "exact", "stream", "index", "bytes")


def make_rows(path: Path, n: int) -> None:
    rng = random.Random(0)
    with open(path, "wb") as f:
        for i in range(n):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 100)))
            f.write(orjson.dumps({"id": i, "text": text, "score": rng.random(), "tags": WORDS[: i % 4]}) + b"\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench/mds"))
    a = p.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    src = a.workdir / f"rows-{a.rows}.jsonl"
    if not src.is_file():
        make_rows(src, a.rows)
    src.read_bytes()  # in the page cache, for both alike
    py = sys.executable
    theirs_out, ours_out = a.workdir / "mdswriter", a.workdir / "shardsmith"

    def theirs() -> None:
        shutil.rmtree(theirs_out, ignore_errors=True)
        subprocess.run([py, "-c", WRITER, str(src), str(theirs_out)], check=True, capture_output=True)

    def ours() -> None:
        subprocess.run([py, "-m", "shardsmith", "convert", str(src), "-o", str(ours_out), "--to", "mds",
                        "--shard-bytes", "64MiB", "--workers", str(a.workers), "--overwrite", "-q"],
                       check=True, capture_output=True)

    t_import = median_time(lambda: subprocess.run([py, "-c", WRITER], check=True, capture_output=True), a.repeat)
    t_theirs = median_time(theirs, a.repeat)
    t_ours = median_time(ours, a.repeat)
    size = src.stat().st_size / 1e6
    print(f"{a.rows:,} rows, {size:,.0f} MB of JSONL")
    print(f"  MDSWriter (one process, file order):          {t_theirs:6.2f} s  ({size / t_theirs:,.0f} MB/s)")
    print(f"    of which importing streaming (torch):        {t_import:6.2f} s")
    print(f"  shardsmith --to mds (--workers {a.workers}, shuffled): {t_ours:6.2f} s  ({size / t_ours:,.0f} MB/s)")
    key_figure("convert --to mds / MDSWriter wall time", f"{t_ours / t_theirs:.2f}x")


if __name__ == "__main__":
    main()
