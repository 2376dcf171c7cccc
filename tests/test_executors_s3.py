"""An executor's units exchange their work through the bucket when the output is one (``-o
s3://...``), as cluster stages do: a job on a Dask LocalCluster, reading its inputs from S3 too,
makes the objects of a local run's files, byte for byte (a moto server on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_docs, run_cli, tree_digest, write_jsonl

pytest.importorskip("distributed")
pytest.importorskip("s3fs", reason="S3 outputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import _upload, s3, s3_env  # noqa: E402,F401  (fixtures)
from test_s3_outputs import _bucket, _download, _keys  # noqa: E402

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy


def test_a_dask_job_into_a_bucket_makes_the_local_files(s3, tmp_path: Path) -> None:  # noqa: F811
    local = tmp_path / "corpus"
    for i in range(5):
        write_jsonl(local / f"part-{i}.jsonl", make_docs(90, seed=i, max_words=40))
    _upload(s3, "exec-in", local, "corpus")
    args = ["--to", "webdataset", "--text-field", "text", "--shard-samples", "70", "--split", "train=0.8,val=0.2",
            "--seed", "9", "-q"]
    res = run_cli("convert", local, "-o", tmp_path / "local", *args)
    assert res.exit_code == 0, res.stderr
    url = f"s3://{_bucket(s3, 'exec-out')}/tar"
    res = run_cli("convert", "s3://exec-in/corpus/", "-o", url, *args, "--executor", "dask", "--ranks", "3")
    assert res.exit_code == 0 and "Traceback" not in res.stderr, res.stderr
    keys = _keys(s3, "exec-out", "tar")
    assert "manifest.json" in keys and not any(k.startswith(".shardsmith-work") for k in keys), sorted(keys)
    assert tree_digest(_download(s3, "exec-out", "tar", tmp_path / "got")) == tree_digest(tmp_path / "local")
