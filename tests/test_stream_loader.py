"""The loader streams (issue 15, part 3): datasets opened from ``s3://`` on a real moto server, read
through a bounded local cache, give the samples of the local open; the cache stays within its limit,
evicts, checks sha256, serves many processes with one download per shard, and random access on an
uncached tar or token dataset fetches byte ranges only (counted by the fault proxy, which cannot lie).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import orjson
import pytest
from conftest import make_docs, run_cli, write_jsonl
from s3_fault_proxy import Faults, fault_proxy

pytest.importorskip("s3fs", reason="streaming from S3 needs s3fs (pip install 'shardsmith[s3]')")
boto3 = pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

import shardsmith  # noqa: E402
from shardsmith.errors import DatasetError  # noqa: E402
from shardsmith.formats.hdf5.batch import EventBatch  # noqa: E402
from shardsmith.loader import open as open_dataset  # noqa: E402
from test_s3_inputs import KEYS, s3, s3_env  # noqa: E402,F401  (fixtures)

BUCKET = "shardsmith-stream"
FAST = {"retry_wait": 0.01}


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> dict[str, Path]:
    """One small dataset of each format, made by the CLI: several shards each."""
    from shardsmith.demo.icecube_like import make_icecube_kaggle_like

    tmp = tmp_path_factory.mktemp("stream-local")
    write_jsonl(tmp / "docs" / "a.jsonl", make_docs(240, seed=3, max_words=120))
    batches, meta = make_icecube_kaggle_like(tmp / "ice", batches=2, events_per_batch=120, mean_pulses=12, seed=2)
    runs = {
        "webdataset": ["convert", tmp / "docs", "-o", tmp / "webdataset", "--to", "webdataset", "--shard-samples", "40",
                       "--seed", "1"],
        "tokens": ["pack-tokens", tmp / "docs", "-o", tmp / "tokens", "--train-tokenizer", "300",
                   "--shard-tokens", "4000", "--seq-len", "32"],
        "hdf5": ["convert", *batches, "--group-by", "event_id", "--events-table", meta, "-o", tmp / "hdf5",
                 "--to", "hdf5", "--shard-samples", "40"],
        "event-tar": ["convert", *batches, "--group-by", "event_id", "--events-table", meta, "-o",
                      tmp / "event-tar", "--to", "webdataset", "--events-per-sample", "4", "--shard-samples", "10"],
    }
    for name, args in runs.items():
        res = run_cli(*args, "--quiet")
        assert res.exit_code == 0, (name, res.stderr)
    return {name: tmp / name for name in runs}


@pytest.fixture(scope="module")
def bucket(s3_env, local) -> dict[str, str]:  # noqa: F811
    """Every dataset uploaded to ``s3://BUCKET/NAME``; their URLs."""
    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    for name, folder in local.items():
        upload(client, folder, name)
    return {name: f"s3://{BUCKET}/{name}" for name in local}


def upload(client, folder: Path, prefix: str) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            client.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.relative_to(folder).as_posix()}", Body=p.read_bytes())


def shards(folder: Path, split: str = "train") -> list[dict]:
    return orjson.loads((folder / "manifest.json").read_bytes())["splits"][split]["shards"]


def cache_bytes(root: Path) -> int:
    """What the cache folder holds: every regular file's size (what the limit bounds)."""
    total = 0
    for folder, _, names in os.walk(root):
        for n in names:
            try:
                total += os.stat(os.path.join(folder, n)).st_size
            except FileNotFoundError:
                pass
    return total - sum(os.path.getsize(root / n) for n in ("downloads.log",) if (root / n).exists())


def downloads(root: Path) -> list[str]:
    log = root / "downloads.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def same(a, b) -> None:
    """Two samples (dicts, tuples, arrays, bytes, EventBatches) hold the same values."""
    if isinstance(a, EventBatch):
        assert a.n == b.n
        same(a.fixed, b.fixed)
        same({k: (r.values, r.offsets) for k, r in a.ragged.items()}, {k: (r.values, r.offsets) for k, r in b.ragged.items()})
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


def opened(url: str, cache: Path, limit: int | str = "1GB", **kw):
    return open_dataset(url, cache_dir=cache, cache_limit=limit, **FAST, **kw)


# -- every format, same samples ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["webdataset", "tokens", "hdf5", "event-tar"])
def test_each_format_from_s3_gives_the_local_samples(s3, bucket, local, tmp_path, name):  # noqa: F811
    want = shardsmith.open(local[name])
    got = opened(bucket[name], tmp_path / "cache")
    assert type(got) is type(want) and len(got) == len(want) > 0
    assert len(shards(local[name])) >= 3
    n = len(want)
    for i in (0, n // 2, n - 1, -1):  # random access first: ranges on a cold cache
        same(got[i], want[i])
    idx = np.array([n - 1, 0, n // 3, n // 3, 2])
    same(got.get_batch(idx), want.get_batch(idx))
    for a, b in zip(got.iter(shuffle=True, seed=4, epoch=1), want.iter(shuffle=True, seed=4, epoch=1), strict=True):
        same(a, b)
    for a, b in zip(got.iter(shuffle=True, seed=4, batch_size=7), want.iter(shuffle=True, seed=4, batch_size=7),
                    strict=True):
        same(a, b)
    # the cache holds verified copies, by content
    for entry in shards(local[name]):
        cached = tmp_path / "cache" / "data" / entry["sha256"][:2] / entry["sha256"]
        if cached.exists():
            assert cached.read_bytes() == (local[name] / entry["path"]).read_bytes()
    # a pickled copy (a spawned DataLoader worker) reads the same, through the same cache
    copy = pickle.loads(pickle.dumps(got))
    same(copy[n - 2], want[n - 2])
    if name == "tokens":
        win_got = shardsmith.TokenDataset(bucket[name], cache_dir=tmp_path / "cache", cache_limit="1GB")
        win_want = shardsmith.TokenDataset(local[name])
        idx = np.arange(len(win_want))[::-3]
        same(win_got.get_batch(idx), win_want.get_batch(idx))
        same(list(win_got.iter(seed=2, batch_size=16)), list(win_want.iter(seed=2, batch_size=16)))
