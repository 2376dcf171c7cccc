"""Inputs from S3 (issue 15, "Measure"): ``pack-tokens`` and ``convert --to webdataset`` reading from a
moto S3 server, against the same commands on the same files on local disk, and the raw download
rate from that server (the physical limit of this setup).

    .venv/bin/python bench/s3_inputs.py                     # 160 MB of JSONL in 8 objects, 3,000 JPEGs
    .venv/bin/python bench/s3_inputs.py --mb 40 --images 1000 --repeat 1   # a quick look

The moto server runs in this process (``ThreadedMotoServer``, in memory, on a free port); every
command runs as a child process (``python -m shardsmith``), timed wall clock from start to exit,
from a warm page cache, best of ``--repeat``; each S3 run's output must be byte-identical to the
local run's. The corpus (bench/corpus.py, seeds 0..N-1), the tokenizer (bench/make_tokenizers.py,
byte-level BPE 32,000) and the JPEGs (bench/images.py) are deterministic and made once in --work.

Rows: ``download`` lists and reads every object once (the same s3fs client, block size and thread
count as a run's staging, the size known from the listing so only GETs are sent, bytes discarded): MB/s of this machine's moto. ``local`` is the command on the local
files; ``s3`` the command on ``s3://bucket/prefix/``; the ratio s3 / local is the issue's figure
(goal: within 1.3x). ``compare`` is the reusable part: any set of modes of one command (e.g.
staged-first vs overlapped, as ``--on-error skip`` or an option selects them), each checked against
the first mode's bytes.

``--only overlap`` (``overlap``): staging alongside the work. ``pack-tokens`` and ``convert --to
webdataset`` on the JSONL corpus in three modes, interleaved run by run (the machine's load drifts):
``local``; ``staged-first`` (every object downloaded before the run starts, which is what ``--on-error
skip`` does, so that an object that stays unreadable is left out before any work); ``overlapped``
(the default: the run starts once the objects are listed, a stager downloads them in task order
within ``--memory`` ahead of the readers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import HERE, clear, code_version, comparable, warm

KEYS = {"AWS_ACCESS_KEY_ID": "bench-key", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "bench-inputs"
Mode = tuple[list[str], list[str]]  # (inputs, extra options) of one way to run a command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_server() -> tuple[object, dict[str, str]]:
    """A moto S3 server in this process (the runs are child processes); the variables pointing at it."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, {**KEYS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}


def make_corpus(folder: Path, mb: float, files: int) -> Path:
    """``files`` JSONL files of ``mb / files`` MB each (bench/corpus.py, file i from seed i), made once."""
    from corpus import write_corpus

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        path = folder / f"part-{i:03d}.jsonl"
        if not path.exists():
            write_corpus(path.with_suffix(".tmp"), mb / files, seed=i)
            path.with_suffix(".tmp").rename(path)
    return folder


def upload(env: dict[str, str], folder: Path, prefix: str) -> int:
    """Every file below ``folder`` to ``s3://BUCKET/prefix/REL``; returns the bytes uploaded."""
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=KEYS["AWS_DEFAULT_REGION"],
                          aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"])
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    total = 0
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            client.upload_file(str(p), BUCKET, f"{prefix}/{p.relative_to(folder).as_posix()}")
            total += p.stat().st_size
    return total


def run(args: list[str], env: dict[str, str]) -> float:
    """Wall seconds of ``shardsmith ARGS`` in a child process; a failure stops the benchmark."""
    began = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "shardsmith", *args], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if res.returncode != 0:
        raise SystemExit(f"failed: shardsmith {' '.join(args)}\n{res.stderr[-2000:]}")
    return elapsed


def digest(folder: Path) -> dict[str, str]:
    """sha256 of each file but the manifest (its source names the inputs' place), the card less its command line."""
    return {p.name: hashlib.sha256(comparable(p.name, p.read_bytes())).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != "manifest.json"}


def compare(name: str, command: list[str], modes: dict[str, Mode], *, work: Path, env: dict[str, str],
            repeat: int, warm_paths: list[str]) -> dict[str, float]:
    """Best-of-``repeat`` wall seconds of ``command`` (``[subcommand, options...]``) in each mode
    (``{mode: (inputs, extra options)}``), each run's output checked byte-identical to the first
    mode's; prints one row per mode with its ratio to the first. Reusable for any set of modes
    (local, staged-first, overlapped ...)."""
    seconds: dict[str, float] = {}
    reference: dict[str, str] | None = None
    first = next(iter(modes))
    for mode, (inputs, extra) in modes.items():
        out = work / f"out-{name}-{mode}"
        best = float("inf")
        for _ in range(repeat):
            clear([out])
            warm(warm_paths)
            best = min(best, run([command[0], *inputs, "-o", str(out), *command[1:], *extra], env))
            got = digest(out)
            records = json.loads((out / "manifest.json").read_bytes())["source"]["records"]
            reference = reference or got
            if got != reference:
                raise SystemExit(f"{name} {mode}: the output differs from the {first} run's")
        clear([out])
        seconds[mode] = best
        print(f"  {name:30s} {mode:13s} {best:7.2f} s  {best / seconds[first]:5.2f}x {first}  ({records:,} records)",
              flush=True)
    return seconds


def _download_child(prefix: str, threads: int, head: bool) -> dict[str, float]:
    """In a child: every object below ``s3://BUCKET/prefix/`` read once in 8 MB ranged reads by
    ``threads`` threads (shardsmith's staging client and block size), bytes discarded; ``head``:
    each open asks the object's size first (a HEAD, as an open without ``size`` does)."""
    from concurrent.futures import ThreadPoolExecutor

    from shardsmith.engine.inputs import url_inputs
    from shardsmith.storage import schemes

    fs = schemes.filesystem([f"s3://{BUCKET}/{prefix}/"])
    began = time.perf_counter()
    listed = [(k, v["size"]) for k, v in fs.find(f"{BUCKET}/{prefix}", detail=True).items() if v["type"] == "file"]

    def read(key_size: tuple[str, int]) -> int:
        n = 0
        size = None if head else key_size[1]  # known from the listing: GETs only
        with fs.open(key_size[0], "rb", block_size=url_inputs.BLOCK, size=size) as f:
            while block := f.read(url_inputs.BLOCK):
                n += len(block)
        return n

    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(read, listed))
    return {"objects": len(listed), "bytes": total, "seconds": time.perf_counter() - began}


def download_rate(prefix: str, env: dict[str, str], *, repeat: int, head: bool = False) -> dict[str, float]:
    """The best of ``repeat`` child runs of ``_download_child``: objects, bytes, seconds, MB/s."""
    from shardsmith.storage.stager import THREADS

    best: dict[str, float] = {}
    for _ in range(repeat):
        res = subprocess.run([sys.executable, __file__, "--child-download", prefix, str(THREADS),
                              str(int(head))], env=env, capture_output=True, text=True, check=True)
        got = json.loads(res.stdout.strip().splitlines()[-1])
        if not best or got["seconds"] < best["seconds"]:
            best = got
    best["mb_per_s"] = best["bytes"] / 1e6 / best["seconds"]
    print(f"  {'download ' + prefix:30s} {'GET+HEAD' if head else 'GET':13s} {best['seconds']:7.2f} s  "
          f"{best['mb_per_s']:6.0f} MB/s "
          f"({int(best['objects'])} objects, {best['bytes'] / 1e6:.0f} MB, {THREADS} threads)", flush=True)
    return best


def overlap(corpus: Path, tokenizer: Path, env: dict[str, str], *, work: Path, repeat: int,
            workers: int) -> dict[str, dict[str, float]]:
    """Staging alongside the work: ``{command: {mode: best wall seconds}}`` for local, staged-first
    (``--on-error skip`` stages every object first) and overlapped runs, interleaved run by run;
    every output checked byte-identical to the local run's."""
    prefix = f"s3://{BUCKET}/corpus/"
    modes: dict[str, Mode] = {"local": ([str(corpus)], []), "staged-first": ([prefix], ["--on-error", "skip"]),
                              "overlapped": ([prefix], [])}
    commands = {"pack-tokens": ["pack-tokens", "--tokenizer", str(tokenizer)],
                "convert --to webdataset": ["convert", "--to", "webdataset"]}
    table: dict[str, dict[str, float]] = {}
    for name, command in commands.items():
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        reference: dict[str, str] | None = None
        for _ in range(repeat):
            for mode, (inputs, extra) in modes.items():
                out = work / f"out-overlap-{mode}"
                clear([out])
                warm([str(corpus)])
                times[mode].append(run([command[0], *inputs, "-o", str(out), *command[1:], "--workers",
                                        str(workers), "-q", *extra], env))
                got = digest(out)
                reference = reference or got
                if got != reference:
                    raise SystemExit(f"{name} {mode}: the output differs from the local run's")
                clear([out])
        table[name] = {mode: min(t) for mode, t in times.items()}
        for mode, t in times.items():
            print(f"  {name:30s} {mode:13s} {min(t):7.2f} s  {min(t) / table[name]['local']:5.2f}x local  "
                  f"(runs: {', '.join(f'{x:.2f}' for x in t)})", flush=True)
    return table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=160, help="JSONL corpus in MB (10**6 bytes); default 160")
    ap.add_argument("--files", type=int, default=8, help="objects the corpus is split into; default 8")
    ap.add_argument("--images", type=int, default=3000, help="JPEGs (~27 KB each, 100 classes); default 3,000")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each row (best is shown); default 2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/shardsmith-bench/s3-inputs-faults"))
    ap.add_argument("--only", choices=["overlap"], help="run one measurement only")
    ap.add_argument("--child-download", nargs=3, metavar=("PREFIX", "THREADS", "HEAD"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_download:
        prefix, threads, head = args.child_download
        print(json.dumps(_download_child(prefix, int(threads), head == "1")))
        return

    sys.path.insert(0, str(HERE))
    from images import ensure_imagefolder
    from make_tokenizers import make_tokenizers

    args.work.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(args.work / f"corpus-{args.mb:g}mb-{args.files}", args.mb, args.files)
    tokenizer = make_tokenizers(corpus / "part-000.jsonl", args.work / "tokenizers", sample_mb=2)["bpe"]
    images = args.work / f"images-{args.images}"
    if args.only is None:
        ensure_imagefolder(images, args.images)
    print(f"S3 inputs benchmark: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; {code_version()}")
    server, s3 = moto_server()
    try:
        env = {**os.environ, **s3, "PYTHONPATH": str(HERE.parent)}
        if args.only == "overlap":
            upload(s3, corpus, "corpus")
            overlap(corpus, tokenizer, env, work=args.work, repeat=args.repeat, workers=args.workers)
            return
        for folder, prefix in ((corpus, "corpus"), (images, "images")):
            began = time.perf_counter()
            size = upload(s3, folder, prefix)
            print(f"uploaded {folder} ({size / 1e6:.0f} MB) to s3://{BUCKET}/{prefix}/ in "
                  f"{time.perf_counter() - began:.1f} s")
        print(f"\n  {'':30s} {'mode':13s} {'wall':>9s}  ratio")
        for prefix in ("corpus", "images"):  # the limit; and with a HEAD per object, as staging opens them now
            download_rate(prefix, env, repeat=args.repeat)
            download_rate(prefix, env, repeat=args.repeat, head=True)
        workers = ["--workers", str(args.workers), "-q"]
        tokens = compare("pack-tokens (JSONL)", ["pack-tokens", "--tokenizer", str(tokenizer), *workers],
                         {"local": ([str(corpus)], []), "s3": ([f"s3://{BUCKET}/corpus/"], [])},
                         work=args.work, env=env, repeat=args.repeat, warm_paths=[str(corpus)])
        tars = compare("convert --to webdataset (JPEG)", ["convert", "--to", "webdataset", *workers],
                       {"local": ([str(images)], []), "s3": ([f"s3://{BUCKET}/images/"], [])},
                       work=args.work, env=env, repeat=args.repeat, warm_paths=[str(images)])
    finally:
        server.stop()  # type: ignore[attr-defined]
    for name, t in (("pack-tokens", tokens), ("convert --to webdataset", tars)):
        ratio = t["s3"] / t["local"]
        print(f"  {'PASS' if ratio <= 1.3 else 'FAIL'}  {name} from S3 within 1.3x of local: {ratio:.2f}x")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min; anything "
          f"else running skews the figures)")


if __name__ == "__main__":
    main()
