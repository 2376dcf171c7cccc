"""Labels of a streamed dataset (issue 16 point 5 with issue 15 part 3): ``member_bytes`` on an
uncached tar dataset in S3 (moto server) downloads each shard once into the cache (a range per
sample would be a request each) and equals the local read."""

from __future__ import annotations

import pytest

pytest.importorskip("s3fs", reason="streaming from S3 needs s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import s3, s3_env  # noqa: E402,F401  (fixtures)
from test_stream_loader import bucket, local, opened  # noqa: E402,F401  (fixtures)

import shardsmith  # noqa: E402


def test_a_streamed_tar_datasets_member_is_read_from_whole_shards(s3, bucket, local, tmp_path):  # noqa: F811
    want = shardsmith.open(local["webdataset"]).member_bytes("json")
    got = opened(bucket["webdataset"], tmp_path / "cache")
    assert got.member_bytes("json") == want and all(want)
    assert not got._files.ranged_bytes  # whole shards, not a range per sample
