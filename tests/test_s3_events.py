"""Physics events from S3 (issue 15, part 1): ROOT files and Parquet events staged from the moto
server convert to HDF5 and to tar with the bytes of the same command on the local files. (ROOT
files on S3 are staged; on XRootD they are read in place: tests/test_xrootd_inputs.py.)
"""

from __future__ import annotations

import shutil

import pytest
from conftest import root_data, run_cli, same_dataset

pytest.importorskip("s3fs", reason="S3 inputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")
pytest.importorskip("uproot", reason="ROOT files need uproot (pip install 'shardsmith[root]')")

from test_s3_inputs import _upload, s3, s3_env  # noqa: E402,F401  (fixtures)


@pytest.mark.parametrize("to, extra", [("hdf5", ["--step-size", "64KB"]),
                                       ("webdataset", ["--branches", "Muon_*,NMuon"])])
def test_root_files_from_s3_equal_local(s3, tmp_path, to, extra):  # noqa: F811  (the fixture imported above)
    local = tmp_path / "events"
    (local / "more").mkdir(parents=True)
    shutil.copyfile(root_data() / "uproot-HZZ.root", local / "a.root")
    shutil.copyfile(root_data() / "uproot-HZZ.root", local / "more" / "b.root")
    _upload(s3, "shardsmith-root", local, "events")
    common = ["--to", to, "--workers", "2", "--seed", "11", *extra, "-q"]
    assert run_cli("convert", local, "-o", tmp_path / "ref", *common).exit_code == 0
    got = run_cli("convert", "s3://shardsmith-root/events/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")


@pytest.mark.parametrize("to", ["hdf5", "webdataset"])
def test_parquet_events_from_s3_equal_local(s3, tmp_path, to):  # noqa: F811
    from shardsmith.demo.icecube_like import make_icecube_kaggle_like

    batches, meta = make_icecube_kaggle_like(tmp_path / "pq" / "batches", batches=3, events_per_batch=200,
                                             mean_pulses=6, seed=4, row_group_rows=500)
    _upload(s3, "shardsmith-parquet", tmp_path / "pq" / "batches", "batches")
    common = ["--to", to, "--group-by", "event_id", "--workers", "2", "--seed", "2", "-q"]
    # the events table (an option's file) stays local: a command's options name local files
    local_batches = [b for b in batches if b != meta]
    assert run_cli("convert", *local_batches, "--events-table", meta, "-o", tmp_path / "ref", *common).exit_code == 0
    got = run_cli("convert", "s3://shardsmith-parquet/batches/batch_*.parquet", "--events-table", meta,
                  "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
