"""``convert --to memmap`` cluster stages into a real S3 server (moto in server mode): the objects
equal a local run's files (one machine into S3: ``test_s3_outputs.py``'s
``test_convert_events_to_s3_equals_local``)."""

from __future__ import annotations

import pytest
from conftest import root_data, run_cli, same_dataset

pytest.importorskip("s3fs", reason="S3 outputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import s3, s3_env  # noqa: E402,F401  (fixtures)
from test_s3_outputs import _bucket, _download, store  # noqa: E402,F401  (fixtures)


def test_memmap_stages_into_s3_equal_the_local_run(s3, tmp_path, monkeypatch):  # noqa: F811
    """Cluster stages whose only shared place is the bucket: rank 0 of the gather writes the arrays
    (one writer per split), uploads them; finalize puts the manifest. Objects = the local files."""
    from test_s3_outputs import _small_parts

    _small_parts(monkeypatch, tmp_path)
    args = ["convert", root_data() / "uproot-HZZ.root", "--to", "memmap", "--branches", "Jet_*,NJet",
            "--max-len", "4", "--split", "train=0.8,val=0.2", "-q"]
    assert run_cli(*args, "-o", tmp_path / "one").exit_code == 0
    bucket = _bucket(s3, "memmap-stages")
    url = f"s3://{bucket}/mm"
    for stage, ranks in (("scatter", (0, 1)), ("plan", (0,)), ("gather", (1, 0)), ("finalize", (0,))):
        for rank in ranks:
            monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "nodes" / f"{stage}-{rank}"))
            res = run_cli(*args, "-o", url, "--stage", stage, "--rank", str(rank), "--world-size", "2")
            assert res.exit_code == 0, (stage, rank, res.stderr)
    got = _download(s3, bucket, "mm", tmp_path / "got")
    same_dataset(tmp_path / "one", got)
