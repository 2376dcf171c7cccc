"""The loader streams (issue 15, part 3): datasets opened from ``s3://`` on a real moto server, read
through a bounded local cache, give the samples of the local open; the cache stays within its limit,
evicts, checks sha256, serves many processes with one download per shard, and random access on an
uncached tar or token dataset fetches byte ranges only (counted by the fault proxy, which cannot lie).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import orjson
import pytest
from conftest import make_docs, run_cli, write_jsonl
from s3_fault_proxy import Faults, proxied  # noqa: F401  (a fixture)

pytest.importorskip("s3fs", reason="streaming from S3 needs s3fs (pip install 'shardsmith[s3]')")
boto3 = pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import KEYS, s3, s3_env  # noqa: E402,F401  (fixtures)

import shardsmith  # noqa: E402
from shardsmith import loader  # noqa: E402
from shardsmith.errors import DatasetError  # noqa: E402
from shardsmith.kit.event_batch import EventBatch  # noqa: E402
from shardsmith.loader import open as open_dataset  # noqa: E402

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
    """What the cache folder holds: every regular file's size (what the limit bounds), each file once
    (by inode: a download renamed into place while the folder is walked is seen once)."""
    sizes = {}
    for folder, _, names in os.walk(root):
        for n in names:
            if n != "downloads.log":  # the test's own counter (SHARDSMITH_CACHE_LOG), outside the limit
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(os.path.join(folder, n))
                    sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


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


# -- the cache's limit, eviction and checks, on S3 ----------------------------------------------------

class Watcher:
    """The cache folder's size, sampled every millisecond in a thread while a test runs."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self._stop = root, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            if self.root.exists():
                self.peak = max(self.peak, cache_bytes(self.root))

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("name", ["hdf5", "webdataset"])
def test_an_epoch_stays_within_the_limit_and_evicts(s3, bucket, local, tmp_path, monkeypatch, name):  # noqa: F811
    monkeypatch.setenv("SHARDSMITH_CACHE_LOG", "1")
    entries = shards(local[name])
    sizes = sorted(e["bytes"] + e.get("index", {}).get("bytes", 0) for e in entries)
    limit = sum(sizes[-3:]) + 1024  # three shards (and their indexes) at a time, of six or more
    assert len(entries) >= 6
    cache = tmp_path / "cache"
    want = shardsmith.open(local[name])
    got = opened(bucket[name], cache, limit)
    seen = 0
    with Watcher(cache) as watcher:
        for epoch in range(2):
            for a, b in zip(got.iter(shuffle=name == "hdf5", seed=1, epoch=epoch, batch_size=8),
                            want.iter(shuffle=name == "hdf5", seed=1, epoch=epoch, batch_size=8), strict=True):
                same(a, b)
                assert cache_bytes(cache) <= limit
                seen += 1
    assert seen and watcher.peak <= limit, (watcher.peak, limit)
    fetched = downloads(cache)
    # read whole, but for a shard whose samples were all read by ranges while its download was under way
    assert len({e["sha256"] for e in entries} & set(fetched)) >= len(entries) // 2
    assert len(fetched) > len(set(fetched)), "shards were evicted and fetched again in the second epoch"


def test_a_tampered_shard_is_one_error_line_and_is_removed(s3, bucket, local, tmp_path):  # noqa: F811
    folder = tmp_path / "tampered"
    os.system(f"cp -r {local['webdataset']} {folder}")
    victim = shards(folder)[1]
    data = bytearray((folder / victim["path"]).read_bytes())
    data[1000] ^= 0xFF  # same size, one byte changed: only the sha256 tells
    (folder / victim["path"]).write_bytes(bytes(data))
    upload(s3, folder, "tampered")
    ds = opened(f"s3://{BUCKET}/tampered", tmp_path / "cache")
    with pytest.raises(DatasetError) as err:
        for _ in ds.iter(shuffle=False):
            pass
    msg = str(err.value)
    assert "\n" not in msg and "sha256" in msg and f"s3://{BUCKET}/tampered/{victim['path']}" in msg, msg
    assert not (tmp_path / "cache" / "data" / victim["sha256"][:2] / victim["sha256"]).exists()
    assert not [n for n in os.listdir(tmp_path / "cache" / "tmp") if n.startswith(victim["sha256"])]


@pytest.mark.parametrize("name", ["webdataset", "tokens", "hdf5", "event-tar"])
def test_a_shard_object_of_another_size_is_refused_at_open_as_a_local_one(s3, bucket, local, tmp_path, name):  # noqa: F811
    """Issue 42 item 2: a shard whose bytes and size differ from the manifest (here its bytes
    flipped and a page more) served random-access windows from the bucket, silently; a local open
    refuses it. Both now refuse it when opened, in the same one line naming the file."""
    folder = tmp_path / "grown"
    shutil.copytree(local[name], folder)
    victim = shards(folder)[1]
    path = folder / victim["path"]
    path.write_bytes(bytes(b ^ 0x5A for b in path.read_bytes()) + bytes(4096))
    with pytest.raises(DatasetError) as here:
        shardsmith.open(folder)
    prefix = f"grown-{name}"
    upload(s3, folder, prefix)
    with pytest.raises(DatasetError) as there:
        opened(f"s3://{BUCKET}/{prefix}", tmp_path / "cache")
    said = "as the manifest says"
    for err, where in ((here, str(path)), (there, f"s3://{BUCKET}/{prefix}/{victim['path']}")):
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(where + ":") and said in msg, msg
        assert f"({victim['bytes'] + 4096} bytes)" in msg, msg


@pytest.mark.parametrize("name", ["webdataset", "hdf5"])
def test_a_shard_of_another_size_is_skipped_when_asked_local_and_streamed_alike(s3, bucket, local, tmp_path, name):  # noqa: F811
    """Issue 44 item 3: opened with ``on_error="skip"``, a shard of another size than the manifest's is
    refused at its reads instead of at the open, so ``ds.iter(on_error="skip")`` replaces exactly its
    samples: the same batches, the same skips, from a folder and from a bucket."""
    folder = tmp_path / "grown"
    shutil.copytree(local[name], folder)
    victim = shards(folder)[1]
    path = folder / victim["path"]
    path.write_bytes(path.read_bytes() + bytes(4096))
    prefix = f"grown-skip-{name}"
    upload(s3, folder, prefix)
    got = {}
    for where, ds in (("local", shardsmith.open(folder, on_error="skip")),
                      ("s3", opened(f"s3://{BUCKET}/{prefix}", tmp_path / "cache", on_error="skip"))):
        it = ds.iter(seed=3, batch_size=8, on_error="skip", max_skipped=victim["samples"])
        batches = [[{k: v.tolist() for k, v in b.event(j).items()} for j in range(len(b))]
                   if isinstance(b, EventBatch) else [s["__key__"] for s in b] for b in it]
        skipped = [(e["index"], e["key"], e["reason"]) for e in it.report().skipped]
        got[where] = (pickle.dumps(batches), skipped)
        first = sum(e["samples"] for e in shards(folder)[:1])
        assert sorted(i for i, _, _ in skipped) == list(range(first, first + victim["samples"]))
    assert got["local"] == got["s3"]


TRUNCATE = r"""
import json, os, sys
import numpy as np
import shardsmith
from shardsmith.errors import DatasetError

cache = sys.argv[2]
for name, where, shard in json.loads(sys.argv[1]):
    kw = {"cache_dir": cache, "cache_limit": "1GB"} if where.startswith("s3://") else {}
    ds = shardsmith.TokenDataset(where, **kw) if name == "tokens" else shardsmith.open(where, **kw)
    next(iter(ds.iter(shuffle=False)))  # the first shard mapped (a streamed one downloaded into the cache first)
    if name == "hdf5":
        assert ds._shard(0).mm is not None, "the HDF5 shard is mapped"
    os.chmod(shard, 0o644)  # (cached files are read-only)
    os.truncate(shard, 0)  # by "another program", while it is mapped
    try:
        ds.get_batch(np.arange(2))
    except DatasetError as exc:
        print(f"{name} {where}: {exc}", flush=True)
    else:
        print(f"{name} {where}: READ", flush=True)
"""


def test_a_file_truncated_while_mapped_is_an_error_not_sigbus(s3, s3_env, bucket, local, tmp_path):  # noqa: F811
    """Issue 42 item 10: a cached shard (or a local one) truncated by another process while a
    reader has it mapped killed the reader with SIGBUS. Each is now a DatasetError line naming
    the file, before any byte past its new end is touched. The reads run in a subprocess: SIGBUS
    would kill the pytest worker."""
    cache = tmp_path / "cache"
    cases = []
    # each way a shard is mapped (tokens, tar, HDF5), from a folder and from the cache alike
    for name, streamed in (("tokens", False), ("tokens", True), ("webdataset", True), ("hdf5", False)):
        entry = shards(local[name])[0]
        if streamed:
            cases.append((name, bucket[name], str(cache / "data" / entry["sha256"][:2] / entry["sha256"])))
        else:
            copy = tmp_path / f"local-{name}"
            shutil.copytree(local[name], copy)
            cases.append((name, str(copy), str(copy / entry["path"])))
    env = {**os.environ, **s3_env, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                                   os.environ.get("PYTHONPATH", "")])}
    got = subprocess.run([sys.executable, "-c", TRUNCATE, json.dumps(cases), str(cache)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, (got.returncode, got.stdout, got.stderr[-2000:])  # -7: SIGBUS
    lines = got.stdout.splitlines()
    assert len(lines) == len(cases), got.stdout
    for (name, where, shard), line in zip(cases, lines):
        named = shard if name == "hdf5" else f"{where}/{shards(local[name])[0]['path']}"  # (HDF5: the file opened)
        assert line.startswith(f"{name} {where}: {named}: truncated to 0 of its "), line
        assert line.endswith("open the dataset again"), line


# -- random access by byte ranges: counted by the proxy ----------------------------------------------


def fetched_bytes(faults: Faults, key: str) -> int:
    """Bytes the proxy passed for GETs of ``key`` (a GET without a Range counts as the whole object)."""
    total = 0
    for method, path, rng, what in faults.requests:
        if method == "GET" and urlsplit(path).path.endswith("/" + key) and what == "pass":
            if not rng:
                return 1 << 60
            a, b = rng.split("=")[1].split("-")
            total += int(b) - int(a) + 1
    return total


@pytest.mark.parametrize("name", ["webdataset", "tokens"])
def test_random_access_on_an_uncached_dataset_fetches_byte_ranges(proxied, bucket, local, tmp_path, name):  # noqa: F811
    faults = proxied(Faults())
    entries = shards(local[name])
    shard = entries[2]
    want = shardsmith.open(local[name])
    got = opened(bucket[name], tmp_path / "cache")
    first = sum(e["samples"] for e in entries[:2])
    picks = [first, first + shard["samples"] // 2, first + shard["samples"] - 1]
    for i in picks:
        same(got[i], want[i])
    key = f"{name}/{shard['path']}"
    used = fetched_bytes(faults, key)
    assert 0 < used < shard["bytes"] // 4, (used, shard["bytes"])
    assert not (tmp_path / "cache" / "data" / shard["sha256"][:2] / shard["sha256"]).exists()
    index = shard["index"]
    assert (tmp_path / "cache" / "data" / index["sha256"][:2] / index["sha256"]).exists(), "the index is kept"
    assert got._files.ranged_bytes if name == "webdataset" else got._shards._files.ranged_bytes


# -- many processes, one cache -------------------------------------------------------------------------

RANK = """
import hashlib, json, pickle, sys
import torch
from shardsmith.loader import open as open_dataset
from shardsmith.torch import TarIterable

url, cache, limit, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ds = open_dataset(url, cache_dir=cache, cache_limit=limit, retry_wait=0.01)
it = TarIterable(ds, shuffle=True, seed=3, rank=rank, world_size=2)
loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2, collate_fn=lambda s: s)
out = {s["__key__"]: hashlib.sha256(pickle.dumps(sorted(s.items()))).hexdigest() for s in loader}
print(json.dumps(out))
"""


def test_two_ranks_of_two_workers_share_one_cache(s3, s3_env, bucket, local, tmp_path):  # noqa: F811
    entries = shards(local["webdataset"])
    limit = sum(e["bytes"] + e["index"]["bytes"] + 128 for e in entries)
    cache = tmp_path / "cache"
    env = {**os.environ, **s3_env, "SHARDSMITH_CACHE_LOG": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    with Watcher(cache) as watcher:
        procs = [subprocess.Popen([sys.executable, script, bucket["webdataset"], cache, str(limit), str(r)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err
    got = [json.loads(out) for out, _ in results]
    assert not set(got[0]) & set(got[1]), "no sample twice"
    want = shardsmith.open(local["webdataset"])
    digests = {s["__key__"]: hashlib.sha256(pickle.dumps(sorted(s.items()))).hexdigest()
               for s in want.iter(shuffle=False)}
    merged = {**got[0], **got[1]}
    assert len(merged) == len(want) - len(want) % 2 and all(digests[k] == v for k, v in merged.items())
    fetched = downloads(cache)
    assert sorted(fetched) == sorted({e["sha256"] for e in entries} | {e["index"]["sha256"] for e in entries}), \
        "each shard and index downloaded once on the node"
    assert watcher.peak <= limit


# -- faults and safety ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["webdataset", "tokens", "hdf5"])
def test_an_epoch_through_a_flaky_store_yields_the_same_samples(proxied, bucket, local, tmp_path, name):  # noqa: F811
    faults = proxied(Faults(slowdown=0.15, reset=0.15, seed=6))  # seed 6: draws both faults with the requests made now
    want = shardsmith.open(local[name])
    got = opened(bucket[name], tmp_path / "cache", retries=10)
    n = len(want)
    for i in (1, n // 2):
        same(got[i], want[i])
    for a, b in zip(got.iter(seed=9, batch_size=5), want.iter(seed=9, batch_size=5), strict=True):
        same(a, b)
    assert faults.count("503") and faults.count("reset"), faults.requests[:5]


def test_names_stay_below_the_prefix_and_credentials_are_never_shown(s3, bucket, tmp_path):  # noqa: F811
    from shardsmith.storage.streamed import RemoteStore

    store = RemoteStore(bucket["webdataset"])
    for bad in ("../tokens/manifest.json", "a/../../x", "/etc/passwd", "./a"):
        with pytest.raises(DatasetError, match="refusing path"):
            store.key(bad)
    with pytest.raises(Exception) as err:
        open_dataset(f"s3://AKIAXX:hush-hush-secret@{BUCKET}/webdataset", cache_dir=tmp_path / "c")
    assert "hush-hush-secret" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DatasetError) as err:
        opened(f"s3://{BUCKET}/nothing-here", tmp_path / "c")
    assert "manifest.json" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(Exception, match="cache_dir"):
        open_dataset(bucket["webdataset"])


# -- a dataset rewritten at its URL while it is open (issue 26) ----------------------------------------

CHANGED = "changed since the dataset was opened"


def flip_objects(client, prefix: str) -> None:
    """Every object of the dataset but its manifest rewritten in place: other bytes, the same size."""
    for obj in client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")["Contents"]:
        if not obj["Key"].endswith("/manifest.json"):
            data = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
            client.put_object(Bucket=BUCKET, Key=obj["Key"], Body=bytes(b ^ 0x5A for b in data))


def refused(read, url: str) -> None:
    with pytest.raises(DatasetError, match=CHANGED) as err:
        read()
    assert "\n" not in str(err.value) and url in str(err.value), str(err.value)


@pytest.mark.parametrize("kind", ["TokenDataset", "TokenDocuments", "TarDataset"])
def test_objects_replaced_after_opening_are_refused_never_mixed(s3, local, bucket, tmp_path, kind):  # noqa: F811
    name = "webdataset" if kind == "TarDataset" else "tokens"
    prefix = f"replaced-{kind}"
    upload(s3, local[name], prefix)
    url = f"s3://{BUCKET}/{prefix}"
    ds = getattr(loader, kind)(url, cache_dir=tmp_path / "cache", cache_limit="1GB")
    ds[0]  # the first shard read (by ranges) and its index cached
    blob = pickle.dumps(ds)  # as a spawned DataLoader worker gets it
    flip_objects(s3, prefix)
    last = len(ds) - 1  # on a shard not read yet: nothing of it cached
    refused(lambda: ds[last], url)
    refused(lambda: pickle.loads(blob)[last], url)
    refused(lambda: ds[0], url)  # the first shard too: its ranges are read again


def test_pack_tokens_overwrite_into_the_url_of_an_open_dataset(s3, local, tmp_path):  # noqa: F811
    url = f"s3://{BUCKET}/packed-rewritten"
    args = ["pack-tokens", local["tokens"].parent / "docs", "-o", url, "--train-tokenizer", "300", "--pack",
            "best-fit", "--seq-len", "32", "--pack-window", "2K", "--shard-tokens", "3K", "-q"]
    assert run_cli(*args, "--seed", "1").exit_code == 0
    ds = loader.PackedSequences(url, cache_dir=tmp_path / "cache", cache_limit="1GB")
    assert len(ds.manifest["splits"]["train"]["shards"]) >= 2
    ds[0]
    res = run_cli(*args, "--seed", "2", "--overwrite")
    assert res.exit_code == 0, res.stderr
    refused(lambda: ds[len(ds) - 1], url)
