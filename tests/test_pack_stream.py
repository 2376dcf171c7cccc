"""A packed token dataset read from S3 (moto server) through the streaming loader's cache gives the
same sequences and boundaries as the folder."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from conftest import make_docs, run_cli, write_jsonl

pytest.importorskip("s3fs", reason="streaming from S3 needs s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import s3, s3_env  # noqa: E402,F401  (fixtures)

import shardsmith  # noqa: E402


def test_a_packed_dataset_streams_from_s3(s3, tmp_path):  # noqa: F811
    write_jsonl(tmp_path / "docs" / "a.jsonl", make_docs(300, seed=4, max_words=120))
    out = tmp_path / "packed"
    res = run_cli("pack-tokens", tmp_path / "docs", "-o", out, "--train-tokenizer", "300", "--shard-tokens", "4000",
                  "--pack", "best-fit", "--seq-len", "64", "--quiet")
    assert res.exit_code == 0, res.stderr
    s3.create_bucket(Bucket="packed")
    for p in sorted(out.iterdir()):
        s3.put_object(Bucket="packed", Key=f"ds/{p.name}", Body=p.read_bytes())
    want = shardsmith.open(out)
    got = shardsmith.open("s3://packed/ds", cache_dir=tmp_path / "cache", retry_wait=0.01)
    assert type(got) is type(want) and len(got) == len(want) > 0
    for i in (0, len(want) // 2, -1):
        for key in ("tokens", "cu_seqlens"):
            assert np.array_equal(got[i][key], want[i][key])
    copy = pickle.loads(pickle.dumps(got))
    assert np.array_equal(copy[1]["cu_seqlens"], want[1]["cu_seqlens"])
