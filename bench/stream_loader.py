"""Streaming loader (issue 15, part 3): a tar dataset read from a moto S3 server through the cache,
against a warm local read and webdataset streaming the same shards, in one run, with ratios.

A moto server runs as its own process (``moto_server``), so its work is not charged to the loader's
interpreter; the dataset (``corpus.py``'s synthetic JSONL, ``convert --to webdataset``: one sample
per row, version-2 offset indexes) is uploaded with boto3. Rows:

- warm local read: ``TarDataset(folder).iter(shuffle=True)`` from the page cache;
- cold cache, one epoch: ``shardsmith.open(url, cache_dir=<empty>, cache_limit=...)`` then
  ``iter(shuffle=True)`` (exact per-sample shuffle) and ``iter(shuffle=False)``;
- random access on an uncached dataset: ``ds[i]`` for ``--random`` random samples (byte ranges);
- webdataset: ``webdataset.WebDataset`` over the shards' presigned HTTP URLs (its curl pipe), in shard
  order, no shuffle buffer: its cold streaming read of the same bytes;
- peak cache size with 2 ranks (processes) x 2 DataLoader workers on one cache folder, limit a
  third of the dataset, through ``shardsmith.torch.TarIterable``.

MosaicML streaming is not compared: ``pip install --dry-run mosaicml-streaming`` in the project
venv would replace torch 2.13.0 (CPU) by torch 2.14.1 with CUDA packages.

    .venv/bin/python bench/stream_loader.py [--mb 40] [--shard-bytes 4MB] [--random 500] [--limit 0.34]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import write_corpus  # noqa: E402
from harness import code_version, key_figure  # noqa: E402

KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "shardsmith-bench"

RANK = """
import sys, time, torch
from shardsmith.loader import open as open_dataset
from shardsmith.torch import TarIterable
url, cache, limit, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ds = open_dataset(url, cache_dir=cache, cache_limit=limit)
loader = torch.utils.data.DataLoader(TarIterable(ds, shuffle=True, seed=3, rank=rank, world_size=2),
                                     batch_size=None, num_workers=2, collate_fn=lambda s: s)
t0 = time.perf_counter()
n = sum(1 for _ in loader)
print(n, time.perf_counter() - t0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def folder_bytes(root: Path) -> int:
    sizes = {}
    for d, _, names in os.walk(root):
        for n in names:
            try:
                st = os.stat(os.path.join(d, n))
            except FileNotFoundError:
                continue
            sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


def epoch(ds, **options) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = sum(1 for _ in ds.iter(**options))
    return n, time.perf_counter() - t0


def fetched(ds) -> int:
    files = ds._files
    return files.cache.downloaded_bytes + files.ranged_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=40, help="the JSONL corpus converted to tar shards")
    ap.add_argument("--shard-bytes", default="4MB")
    ap.add_argument("--random", type=int, default=500)
    ap.add_argument("--limit", type=float, default=1 / 3, help="the cache limit of the 2 x 2 run, as a share of the dataset")
    args = ap.parse_args()
    import boto3

    import shardsmith

    print(f"code: {code_version()}; load average at start: {os.getloadavg()}")
    port = free_port()
    env = {**os.environ, **KEYS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    os.environ.update(env)
    server = subprocess.Popen([shutil.which("moto_server") or "moto_server", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp_name:
            tmp = Path(tmp_name)
            out = tmp / "ds"
            write_corpus(tmp / "corpus.jsonl", args.mb)
            subprocess.run([sys.executable, "-m", "shardsmith", "convert", str(tmp / "corpus.jsonl"), "-o", str(out),
                            "--to", "webdataset", "--shard-bytes", args.shard_bytes, "-q"], check=True)
            files = sorted(p for p in out.rglob("*") if p.is_file())  # the index folder's too
            total = sum(p.stat().st_size for p in files)
            args.shards = len(shardsmith.open(out).manifest["splits"]["train"]["shards"])
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            s3 = boto3.client("s3")
            s3.create_bucket(Bucket=BUCKET)
            for p in files:
                s3.upload_file(str(p), BUCKET, f"ds/{p.relative_to(out).as_posix()}")
            url = f"s3://{BUCKET}/ds"
            print(f"{len(shardsmith.open(out))} samples (JSONL rows) in {args.shards} shards, {total / 1e6:.1f} MB, "
                  f"on moto S3 at port {port}")

            local = shardsmith.open(out)
            epoch(local, shuffle=True, seed=0)  # warm
            n, t_local = epoch(local, shuffle=True, seed=0)
            rows = [("warm local read, iter(shuffle=True)", n / t_local, 0)]

            for shuffle in (True, False):
                cache = tmp / f"cache-{shuffle}"
                ds = shardsmith.open(url, cache_dir=cache, cache_limit="10GB")
                n, t = epoch(ds, shuffle=shuffle, seed=0)
                rows.append((f"S3, cold cache, one epoch, iter(shuffle={shuffle})", n / t, fetched(ds)))

            ds = shardsmith.open(url, cache_dir=tmp / "cache-random", cache_limit="10GB")
            picks = np.random.default_rng(1).integers(0, len(ds), args.random).tolist()
            t0 = time.perf_counter()
            for i in picks:
                ds[i]
            t = time.perf_counter() - t0
            rows.append((f"S3, uncached, ds[i] x {args.random} random", args.random / t, fetched(ds)))
            t0 = time.perf_counter()
            for i in picks:
                local[i]
            rows.append((f"warm local, ds[i] x {args.random} random", args.random / (time.perf_counter() - t0), 0))

            try:
                import webdataset as wds

                urls = [s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": f"ds/{e['path']}"})
                        for e in local.manifest["splits"]["train"]["shards"]]  # signed: curl has no AWS keys
                t0 = time.perf_counter()
                n = sum(1 for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False))
                t = time.perf_counter() - t0
                rows.append(("webdataset over HTTP (curl), shard order, no buffer", n / t,
                             sum(e["bytes"] for e in local.manifest["splits"]["train"]["shards"])))
            except ImportError:
                print("webdataset is not installed: its row is left out")

            print(f"\n{'':58} {'samples/s':>10} {'vs local':>9} {'MB fetched':>11}")
            for label, rate, nbytes in rows:
                print(f"{label:58} {rate:>10,.0f} {rate / rows[0][1]:>8.3f}x {nbytes / 1e6:>11.2f}")
            for label, rate, _ in rows:
                if label.startswith(("S3, cold cache, one epoch, iter(shuffle=True)", "webdataset")):
                    key_figure(label, f"{rate:,.0f} samples/s, {rate / rows[0][1]:.3f}x a warm local read")

            limit = int(total * args.limit)
            cache = tmp / "cache-ranks"
            script = tmp / "rank.py"
            script.write_text(RANK)
            peak, stop = [0], threading.Event()

            def watch() -> None:
                while not stop.wait(0.002):
                    if cache.exists():
                        peak[0] = max(peak[0], folder_bytes(cache))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t0 = time.perf_counter()
            procs = [subprocess.Popen([sys.executable, str(script), url, str(cache), str(limit), str(r)],
                                      env={**env, "SHARDSMITH_CACHE_LOG": "1"}, stdout=subprocess.PIPE, text=True)
                     for r in range(2)]
            outs = [p.communicate()[0].split() for p in procs]
            wall = time.perf_counter() - t0
            stop.set()
            watcher.join()
            log = (cache / "downloads.log").read_text().splitlines()
            got = sum(int(o[0]) for o in outs)
            print(f"\n2 ranks x 2 DataLoader workers, one cache, cache_limit {limit / 1e6:.1f} MB (a third of the "
                  f"dataset): {got} samples in {wall:.1f} s (with interpreter and torch start-up); peak cache "
                  f"{peak[0] / 1e6:.2f} MB = {peak[0] / limit:.3f} of the limit; {len(log)} downloads "
                  f"({len({line.split()[0] for line in log})} distinct files of {2 * args.shards})")
    finally:
        server.terminate()
        server.wait()
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
