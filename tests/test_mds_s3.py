"""``convert --to mds`` into a real S3 server (moto in server mode): the objects equal a local run's
files, the split folder's shards and ``index.json`` and the top-level ``index.json`` included (what
the format declares its own, ``MdsFormat.own_files``, is what the upload publishes)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli, same_dataset

pytest.importorskip("s3fs", reason="S3 outputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import s3, s3_env  # noqa: E402,F401  (fixtures)
from test_s3_outputs import _bucket, _download, store  # noqa: E402,F401  (fixtures)


def test_convert_to_mds_in_s3_equals_local(store, tmp_path):  # noqa: F811
    client, _ = store
    bucket = _bucket(client, "out-mds")
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(30)))
    common = ["--to", "mds", "--shard-samples", "8", "-q", "--workers", "1"]
    assert run_cli("convert", src, "-o", tmp_path / "ref", *common).exit_code == 0
    res = run_cli("convert", src, "-o", f"s3://{bucket}/mds/rows", *common)
    assert res.exit_code == 0, res.stderr
    got = _download(client, bucket, "mds/rows", tmp_path / "got", folders=True)
    same_dataset(tmp_path / "ref", got)
    assert {p.relative_to(got).as_posix() for p in got.rglob("*.json")} >= {"index.json", "mds/train/index.json"}
    assert len(list((got / "mds" / "train").glob("shard.*.mds"))) == 4
    assert run_cli("verify", "--deep", got).exit_code == 0
