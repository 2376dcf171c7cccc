"""Cluster stages into object storage (issue 15, part 2): the bucket is the only place the ranks
share. Each rank runs with a cache folder of its own (a node with its own disk), and each folder
is gone once its rank ends: scatter ranks upload their part files under the work prefix, gather
ranks download them and upload their shards, finalize puts the manifest last and removes the
work prefix. The dataset's objects are the files of a one-process local run, byte for byte.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import orjson
import pytest
from conftest import make_docs, run_cli, run_subprocess, tree_digest, write_jsonl

pytest.importorskip("s3fs", reason="S3 outputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import s3, s3_env  # noqa: E402,F401  (fixtures)
from test_s3_outputs import _bucket, _download, _keys, _small_parts  # noqa: E402

from shardsmith.engine.shuffle import outstages  # noqa: E402

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy

WORLD = 3


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    local = tmp_path / "corpus"
    for i in range(6):  # a file is one task: task i is scatter rank i mod 3's
        write_jsonl(local / f"part-{i}.jsonl", make_docs(80, seed=i, max_words=40))
    return local


def _node(monkeypatch, tmp_path: Path, stage: str, rank: int) -> Path:
    """A rank's own disk: its cache (where its staging folder goes)."""
    home = tmp_path / "nodes" / f"{stage}-{rank}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def _rank(monkeypatch, tmp_path: Path, args: list, url: str, stage: str, rank: int) -> str:
    home = _node(monkeypatch, tmp_path, stage, rank)
    res = run_cli(*args, "-o", url, "--stage", stage, "--rank", str(rank), "--world-size", str(WORLD))
    assert res.exit_code == 0, res.stderr
    left = [p for p in home.rglob("*") if p.is_file()] if home.exists() else []
    assert not left, f"{stage} rank {rank} left {left[:3]} on its disk: the bucket holds what ranks share"
    return res.output + res.stderr


def _stages(monkeypatch, tmp_path: Path, args: list, url: str) -> list[tuple[int, int]]:
    """Every stage; returns (bytes read, bytes in the bucket) of the part files, for each gather rank."""
    for rank in range(WORLD):
        _rank(monkeypatch, tmp_path, args, url, "scatter", rank)
    _rank(monkeypatch, tmp_path, args, url, "plan", 0)
    read = []
    for rank in reversed(range(WORLD)):
        said = _rank(monkeypatch, tmp_path, [*args[:-1]], url, "gather", rank)
        got = re.search(r"read ([\d,]+) of the part files' ([\d,]+) bytes", said)
        assert got, said
        read.append(tuple(int(g.replace(",", "")) for g in got.groups()))
    _rank(monkeypatch, tmp_path, args, url, "finalize", 0)
    return read


@pytest.mark.parametrize("run", ["pack-tokens", "convert", "parquet"])
def test_stages_into_s3_equal_the_local_run(s3, corpus, tmp_path, monkeypatch, bpe_tokenizer, run):  # noqa: F811
    """(``parquet``: finalize reads the shards' footers from the bucket; they agree, and are left as a
    local run leaves them.)"""
    _small_parts(monkeypatch, tmp_path)
    monkeypatch.setattr(outstages, "GAP", 0)  # parts of a few KiB here: read each segment's range alone
    command, options = {"pack-tokens": ("pack-tokens", ["--tokenizer", bpe_tokenizer, "--shard-tokens", "4K"]),
                        "convert": ("convert", ["--to", "webdataset", "--shard-samples", "60"]),
                        "parquet": ("convert", ["--to", "parquet", "--shard-samples", "60"])}[run]
    args = [command, corpus, *options, "--memory", "1MB", "--split", "train=0.8,val=0.2", "-q"]
    res = run_cli(*args, "-o", tmp_path / "one")
    assert res.exit_code == 0, res.stderr
    bucket = _bucket(s3, "shardsmith-stage-out")
    url = f"s3://{bucket}/{run}"
    read = _stages(monkeypatch, tmp_path, args, url)
    assert all(r < total for r, total in read), f"each gather rank reads only its groups' segments: {read}"
    keys = _keys(s3, bucket, run)
    assert not [k for k in keys if k.startswith(".shardsmith-work/")], "the work prefix is removed at finalize"
    assert "README.md" in keys, "finalize writes the dataset card and uploads it before the manifest"
    got = _download(s3, bucket, run, tmp_path / "got")
    assert tree_digest(got) == tree_digest(tmp_path / "one")
    ma, mb = (orjson.loads((d / "manifest.json").read_bytes()) for d in (got, tmp_path / "one"))
    for m in (ma, mb):
        m.pop("created"), m.pop("command"), m.pop("run", None)
    assert ma == mb
    # the prefix now holds a finished dataset: stages refuse it in one line
    res = run_cli(*args, "-o", url, "--stage", "scatter", "--rank", "0", "--world-size", str(WORLD))
    assert res.exit_code == 2 and "finished dataset" in res.stderr and "Traceback" not in res.stderr, res.stderr


def _one_then_planned(s3, monkeypatch, tmp_path, args, bucket_name, prefix):  # noqa: F811
    """The one-process run into ``tmp_path/one``, then every scatter rank and the plan into a new
    bucket's ``prefix``: the bucket and the output's URL."""
    res = run_cli(*args, "-o", tmp_path / "one")
    assert res.exit_code == 0, res.stderr
    bucket = _bucket(s3, bucket_name)
    url = f"s3://{bucket}/{prefix}"
    for rank in range(WORLD):
        _rank(monkeypatch, tmp_path, args, url, "scatter", rank)
    _rank(monkeypatch, tmp_path, args, url, "plan", 0)
    return bucket, url


def test_a_killed_rank_redoes_only_its_own_work_and_others_are_refused(s3, corpus, tmp_path, monkeypatch):  # noqa: F811
    _small_parts(monkeypatch, tmp_path)
    args = ["convert", corpus, "--to", "webdataset", "--shard-samples", "60", "--memory", "1MB", "-q"]
    bucket, url = _one_then_planned(s3, monkeypatch, tmp_path, args, "shardsmith-stage-kill", "data")
    # another command's stages into the same prefix: refused, nothing of theirs touched
    other = ["convert", corpus, "--to", "webdataset", "--shard-samples", "70", "--memory", "1MB", "-q"]
    res = run_cli(*other, "-o", url, "--stage", "gather", "--rank", "0", "--world-size", str(WORLD))
    assert res.exit_code == 2 and "different run" in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = run_cli(*args[:-1], "-o", url, "-q")  # a whole run: the prefix holds another's unfinished work
    assert res.exit_code == 2 and "unfinished work of cluster stages" in res.stderr, res.stderr
    # gather rank 1 killed after its shards went up, before it uploaded its piece: its rerun (same
    # node) finds its shards in its folder and the objects in the bucket, and uploads nothing again
    home = _node(monkeypatch, tmp_path, "gather", 1)
    env = {**os.environ, "SHARDSMITH_CRASH_AT": "uploaded"}
    killed = run_subprocess(*args, "-o", url, "--stage", "gather", "--rank", "1", "--world-size", str(WORLD), env=env)
    assert killed.returncode != 0
    before = _keys(s3, bucket, "data")
    assert not any(k.startswith(".shardsmith-work/piece-") for k in before), "killed before its piece"
    assert [p for p in home.rglob("*.tar")], "the killed rank keeps its local shards"
    out = _rank(monkeypatch, tmp_path, [*args[:-1]], url, "gather", 1)
    sent, files, there = map(int, re.search(r"gather rank 1: (\d+) of (\d+) files uploaded \((\d+) were", out).groups())
    assert there >= 1 and sent + there == files, out
    after = _keys(s3, bucket, "data")
    assert all(after[k] == etag for k, etag in before.items() if not k.startswith(".shardsmith-work/")), \
        "its shards and their indexes were not uploaded again"
    for rank in (0, 2):
        _rank(monkeypatch, tmp_path, args, url, "gather", rank)
    _rank(monkeypatch, tmp_path, args, url, "finalize", 0)
    got = _download(s3, bucket, "data", tmp_path / "got")
    assert tree_digest(got) == tree_digest(tmp_path / "one")


def test_nanogpt_is_refused_in_one_line(s3, corpus, tmp_path, monkeypatch, bpe_tokenizer):  # noqa: F811
    _small_parts(monkeypatch, tmp_path)
    bucket = _bucket(s3, "shardsmith-stage-nanogpt")
    res = run_cli("pack-tokens", corpus, "--tokenizer", bpe_tokenizer, "--nanogpt", "-o", f"s3://{bucket}/x",
                  "--stage", "scatter", "--world-size", "2", "-q")
    assert res.exit_code == 2 and "--nanogpt" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_dedup_stages_into_s3_share_the_facts_through_the_bucket(s3, tmp_path, monkeypatch, bpe_tokenizer):  # noqa: F811
    """Each gather rank and finalize decide the duplicates from the facts every scatter rank
    uploaded: the same documents go as in a local run (no rank shares a disk with another)."""
    from test_dedup_exact import planted

    _small_parts(monkeypatch, tmp_path)
    planted(tmp_path / "in", seed=6, n=300)
    args = ["pack-tokens", tmp_path / "in", "--tokenizer", bpe_tokenizer, "--shard-tokens", "4K", "--dedup", "exact",
            "--memory", "1MB", "--split", "train=0.8,val=0.2", "-q"]
    res = run_cli(*args, "-o", tmp_path / "one")
    assert res.exit_code == 0, res.stderr
    bucket = _bucket(s3, "shardsmith-stage-dedup")
    _stages(monkeypatch, tmp_path, args, f"s3://{bucket}/t")
    got = _download(s3, bucket, "t", tmp_path / "got")
    assert tree_digest(got) == tree_digest(tmp_path / "one")
    ma, mb = (orjson.loads((d / "manifest.json").read_bytes()) for d in (got, tmp_path / "one"))
    assert ma["cleaning"] == mb["cleaning"] and ma["cleaning"]["dedup"]["documents"] > 20


def _typed_rows(folder: Path) -> Path:
    """Three inputs of 4 rows (one shard each, in order): ``n`` null in all of the first's, ``v`` ints
    in the first and floats in the second, ``late`` only in the third's rows."""
    for f in range(3):
        rows = [{"id": i, "v": i + 0.5 if f == 1 else i, "n": None if f == 0 else f"t{i}", **({"late": {"a": i}}
                 if f == 2 else {})} for i in range(4 * f, 4 * f + 4)]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rows-{f}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return folder


def test_parquet_shards_of_differing_schemas_are_rewritten_in_the_bucket(s3, tmp_path, monkeypatch):  # noqa: F811
    """Finalize reads the shards' footers from the bucket, rewrites those whose schema is not the
    dataset's and uploads them over their objects: the local run's bytes, also after a finalize
    killed while it rewrote them (same node) and after one killed once they were all uploaded,
    before the manifest (rerun on another node), with one object lost as by a kill between its delete
    and put, and one still the gather's as by a kill before it was replaced."""
    _small_parts(monkeypatch, tmp_path)
    args = ["convert", _typed_rows(tmp_path / "rows"), "--to", "parquet", "--shard-samples", "4",
            "--row-group-rows", "3", "--no-shuffle", "-q"]
    bucket, url = _one_then_planned(s3, monkeypatch, tmp_path, args, "shardsmith-stage-schemas", "pq")
    for rank in range(WORLD):
        _rank(monkeypatch, tmp_path, args, url, "gather", rank)
    gathered = _keys(s3, bucket, "pq")
    written = {k: s3.get_object(Bucket=bucket, Key=f"pq/{k}")["Body"].read() for k in gathered if k.endswith(".parquet")}
    final = ["--stage", "finalize", "--rank", "0", "--world-size", str(WORLD)]
    _node(monkeypatch, tmp_path, "finalize", 0)  # killed twice on one node, which keeps its staging folder
    for crash in ("rejoin:train:1", "uploaded-all"):
        killed = run_subprocess(*args, "-o", url, *final, env={**os.environ, "SHARDSMITH_CRASH_AT": crash})
        assert killed.returncode == -9 and "manifest.json" not in _keys(s3, bucket, "pq"), (crash, killed.stderr)
    uploaded = _keys(s3, bucket, "pq")
    new = sorted(k for k in gathered if k.endswith(".parquet") and uploaded[k] != gathered[k])
    assert len(new) >= 3, "the shards of other schemas went over their objects before the manifest"
    # as if killed while one was replaced (its object deleted, the new one not put): the rerun, on
    # another node, takes its new bytes from their copy under the work prefix; and as if killed
    # before another went over its object (the gather's bytes still there): rewritten again
    s3.delete_object(Bucket=bucket, Key=f"pq/{new[0]}")
    s3.put_object(Bucket=bucket, Key=f"pq/{new[-1]}", Body=written[new[-1]])
    home = _node(monkeypatch, tmp_path, "finalize", 2)
    res = run_cli(*args, "-o", url, *final)
    assert res.exit_code == 0 and not [p for p in home.rglob("*") if p.is_file()], res.stderr
    after = _keys(s3, bucket, "pq")
    assert {k: e for k, e in after.items() if k in new[1:-1]} == {k: uploaded[k] for k in new[1:-1]}  # not again
    got = _download(s3, bucket, "pq", tmp_path / "got")
    assert tree_digest(got) == tree_digest(tmp_path / "one")
    ma, mb = (orjson.loads((d / "manifest.json").read_bytes()) for d in (got, tmp_path / "one"))
    for m in (ma, mb):
        m.pop("created"), m.pop("command"), m.pop("run", None)
    assert ma == mb
