"""Outputs to object storage (issue 15, part 2): the same command into a local folder and into a
moto S3 server, timed side by side.

    python bench/s3_outputs.py [--mb 200] [--workdir /tmp/shardsmith-bench-s3out] [--workers 2]
                               [--shard-bytes 64MB] [--shard-tokens 16M]

One synthetic JSONL corpus (bench/corpus.py), a byte-level BPE trained on its first MB; then
``pack-tokens`` and ``convert --to webdataset --text-field text`` each run twice as child
processes (wall time, start-up included): ``-o LOCAL`` and ``-o s3://bench/...`` against
``moto_server`` started here on a free port (in-memory objects, loopback: the cost measured is
shardsmith's staging, hashing and upload path, not a network's). Each bucket run is checked to hold
the local run's bytes, and the time boto3's own ``upload_file`` takes to upload the same files to
the same server is printed beside it (the server's floor). Goal (issue 15): the bucket run within
1.3x of the local one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import write_corpus  # noqa: E402
from harness import clear, code_version, comparable, run_children, verdict  # noqa: E402

GOAL = 1.3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(port: int, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer on port {port}")


def _files(local: Path) -> list[str]:
    """A dataset folder's files by relative path (the index folder's too): its objects' names."""
    return sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())


def _same(client, bucket: str, prefix: str, local: Path) -> bool:
    """Every local file is an object with its bytes, but for what names the run (harness.comparable)."""
    names = {o["Key"][len(prefix) + 1:] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]}
    if names != set(_files(local)):
        return False
    for name in names:
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()
        mine = (local / name).read_bytes()
        if comparable(name, body) != comparable(name, mine):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200, help="corpus size in MB (10**6 bytes)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench-s3out"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shard-bytes", default="64MB", help="convert --to webdataset: shard size")
    ap.add_argument("--shard-tokens", default="16M", help="pack-tokens: tokens per shard")
    args = ap.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus" / "corpus.jsonl"
    if not corpus.is_file() or abs(corpus.stat().st_size - args.mb * 1e6) > 1e6:
        write_corpus(corpus, args.mb)
    tok = work / "bpe.json"
    if not tok.is_file():
        import orjson

        from shardsmith.text.tokenize import train_bpe

        with open(corpus, "rb") as fh:
            texts = [orjson.loads(line)["text"] for _, line in zip(range(2000), fh)]
        tok.write_text(train_bpe(texts, vocab_size=8000))

    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(port)
        env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
               "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
               "XDG_CACHE_HOME": str(work / "cache")}
        os.environ.update({k: env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                "AWS_DEFAULT_REGION")})
        import boto3

        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        py = [sys.executable, "-m", "shardsmith"]
        runs = {
            "pack-tokens": [*py, "pack-tokens", str(corpus), "--tokenizer", str(tok), "--shard-tokens", args.shard_tokens],
            "convert --to webdataset": [*py, "convert", str(corpus), "--to", "webdataset", "--text-field", "text",
                                        "--shard-bytes", args.shard_bytes],
        }
        print(f"shardsmith {code_version()}; corpus {corpus.stat().st_size / 1e6:.0f} MB, --workers {args.workers}, "
              f"moto_server on 127.0.0.1:{port}")
        for i, (name, cmd) in enumerate(runs.items()):
            local = work / f"local-{i}"
            clear([local])
            common = ["-q", "--workers", str(args.workers)]
            t_local, _, _ = run_children([[*cmd, "-o", str(local), *common]], work / "log.txt", env=env)
            t_s3, _, _ = run_children([[*cmd, "-o", f"s3://bench/run-{i}", *common]], work / "log.txt", env=env)
            files = _files(local)
            size = sum((local / rel).stat().st_size for rel in files) / 1e6
            same = _same(client, "bench", f"run-{i}", local)
            t0 = time.perf_counter()  # the floor: boto3's own parallel upload of the same files, nothing else
            for rel in files:
                client.upload_file(str(local / rel), "bench", f"floor-{i}/{rel}")
            t_floor = time.perf_counter() - t0
            ratio = t_s3 / t_local
            print(f"  {name}: local {t_local:.2f} s, s3 {t_s3:.2f} s ({size:.0f} MB in {len(files)} files; "
                  f"boto3 upload_file of the same files alone: {t_floor:.2f} s): {ratio:.2f}x")
            verdict(f"{name} into S3 within {GOAL}x of local", ratio <= GOAL and same,
                    f"{ratio:.2f}x; same bytes: {same}")
            shutil.rmtree(local)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
