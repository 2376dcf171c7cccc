"""Inputs from S3 (issue 15, part 1): ``convert --to webdataset`` and ``pack-tokens`` from a moto S3
server, against the same commands on the local files.

Each measurement is a function of its own (``overlap``: staging alongside the work); run one with
``--only NAME``. Every run is a child process, timed wall clock from start to exit, output checked
byte-identical to the local run's.

    .venv/bin/python bench/s3_inputs.py --mb 200 --files 8

Modes of ``overlap``: ``local`` (the files on local disk, page cache warm), ``staged-first`` (every
object downloaded before the run starts: what ``--on-error skip`` does, so that an object that
stays unreadable is left out before any work), ``overlapped`` (the default: the run starts once the
objects are listed; a stager downloads them in task order within ``--memory`` ahead of the readers).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import HERE, clear, code_version, warm

KEYS = {"AWS_ACCESS_KEY_ID": "bench-key", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}


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


def _corpus(folder: Path, mb: float, files: int) -> Path:
    """``files`` JSONL files of ``mb / files`` MB each (bench/corpus.py), made once."""
    from corpus import write_corpus

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        path = folder / f"part-{i:03d}.jsonl"
        if not path.exists():
            write_corpus(path, mb / files, seed=i)
    return folder


def _upload(env: dict[str, str], folder: Path, bucket: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"])
    client.create_bucket(Bucket=bucket)
    for p in sorted(folder.iterdir()):
        client.upload_file(str(p), bucket, f"corpus/{p.name}")


def _run(args: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "shardsmith", *args], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if res.returncode != 0:
        raise SystemExit(f"failed: shardsmith {' '.join(args)}\n{res.stderr}")
    return elapsed


def _digest(folder: Path) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != "manifest.json"}


def overlap(*, work: Path, mb: float, files: int, repeat: int, workers: int) -> dict[str, dict[str, float]]:
    """Wall seconds of each command in each mode (local, staged-first, overlapped); the best of
    ``repeat`` runs. Returns ``{command: {mode: seconds}}``."""
    from make_tokenizers import make_tokenizers

    corpus = _corpus(work / f"corpus-{mb:g}mb-{files}", mb, files)
    tokenizer = make_tokenizers(corpus / "part-000.jsonl", work / "tokenizers", sample_mb=2)["bpe"]
    server, s3 = moto_server()
    try:
        bucket = "bench-inputs"
        began = time.perf_counter()
        _upload(s3, corpus, bucket)
        print(f"uploaded {mb:g} MB in {files} objects to moto in {time.perf_counter() - began:.1f} s")
        env = {**os.environ, **s3, "PYTHONPATH": str(HERE.parent)}
        commands = {"convert": ["convert", "--to", "webdataset", "--workers", str(workers), "-q"],
                    "pack-tokens": ["pack-tokens", "--tokenizer", str(tokenizer), "--workers", str(workers), "-q"]}
        modes = {"local": ([str(corpus)], []), "staged-first": ([f"s3://{bucket}/corpus/"], ["--on-error", "skip"]),
                 "overlapped": ([f"s3://{bucket}/corpus/"], [])}
        table: dict[str, dict[str, float]] = {}
        for name, command in commands.items():
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            reference = None
            for _ in range(repeat):  # the modes interleaved: the machine's load drifts between runs
                for mode, (inputs, extra) in modes.items():
                    out = work / f"out-{name}-{mode}"
                    clear([out])
                    warm([str(corpus)])
                    times[mode].append(_run([command[0], *inputs, "-o", str(out), *command[1:], *extra], env))
                    digest = _digest(out)
                    reference = reference or digest
                    assert digest == reference, f"{name} {mode}: output differs from the local run"
                    clear([out])
            table[name] = {mode: min(t) for mode, t in times.items()}
            for mode, t in times.items():
                print(f"  {name:12s} {mode:13s} best {min(t):6.2f} s  ({min(t) / min(times['local']):.2f}x local)"
                      f"  runs: {', '.join(f'{x:.2f}' for x in t)}")
        return table
    finally:
        server.stop()  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200, help="corpus size in MB")
    ap.add_argument("--files", type=int, default=8, help="JSONL objects the corpus is split into")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default="/tmp/shardsmith-bench/s3-inputs")
    ap.add_argument("--only", choices=["overlap"], default=None)
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()}; {code_version()}")
    if args.only in (None, "overlap"):
        overlap(work=Path(args.work), mb=args.mb, files=args.files, repeat=args.repeat, workers=args.workers)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
