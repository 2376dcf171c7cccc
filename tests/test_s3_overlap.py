"""URL inputs are staged alongside the work (issue 15, part 1: "reading overlaps with work"), against
the real moto server behind the counting proxy of ``s3_fault_proxy`` (no faults): the run starts
once the objects are listed, a stager downloads them in the order the tasks read them and never
more than the budget ahead of the readers, and the output is still byte-identical to a local run.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from conftest import make_docs, run_cli, same_dataset, write_jsonl
from s3_fault_proxy import Faults, proxied  # noqa: F401  (a fixture)

pytest.importorskip("s3fs", reason="S3 inputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_faults import flaky  # noqa: E402,F401  (fixtures)
from test_s3_inputs import _upload, s3, s3_env  # noqa: E402,F401  (fixtures)

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy

FILES = 40


def _many(client, tmp_path, bucket: str):
    """FILES JSONL objects of about 100 KB each (4 MB): more than the budget of a 256 KB --memory."""
    local = tmp_path / "many"
    for i in range(FILES):
        write_jsonl(local / f"part-{i:03d}.jsonl", make_docs(500, seed=i, max_words=60))
    assert 60_000 < (local / "part-000.jsonl").stat().st_size < 200_000
    _upload(client, bucket, local, "data")
    return local


def _fetched(faults: Faults) -> set[str]:
    return {urlsplit(r[1]).path.rsplit("/", 1)[1] for r in faults.requests if r[0] == "GET" and r[2]}


def test_limit_stages_only_what_it_reads(flaky, tmp_path):  # noqa: F811  (the fixture imported above)
    client, start = flaky
    local = _many(client, tmp_path, "shardsmith-limit")
    faults = start(Faults())
    common = ["--to", "webdataset", "--workers", "1", "--memory", "256KB", "--limit", "700", "-q"]
    assert run_cli("convert", local, "-o", tmp_path / "ref", *common).exit_code == 0
    got = run_cli("convert", "s3://shardsmith-limit/data/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    fetched = _fetched(faults)
    # 700 records are in the first two files; the budget is 1 MB (the least) ahead of the readers
    assert {"part-000.jsonl", "part-001.jsonl"} <= fetched, fetched
    assert len(fetched) <= 16, f"{len(fetched)} of {FILES} objects downloaded for --limit 700"
    assert not (tmp_path / ".got.shardsmith-work").exists()


@pytest.mark.parametrize("command", ["convert", "pack-tokens"])
def test_staging_within_a_small_budget_equals_local(flaky, tmp_path, bpe_tokenizer, command):  # noqa: F811
    """Forked workers move the point the stager may run ahead of (shared memory): with a budget of a
    tenth of the inputs the run still finishes, with the bytes of the local run."""
    client, start = flaky
    local = _many(client, tmp_path, "shardsmith-budget")
    faults = start(Faults())
    common = (["--to", "webdataset", "--seed", "3"] if command == "convert" else
              ["--tokenizer", bpe_tokenizer, "--shard-tokens", "200K"])
    common += ["--workers", "2", "--memory", "256KB", "-q"]
    assert run_cli(command, local, "-o", tmp_path / "ref", *common).exit_code == 0
    got = run_cli(command, "s3://shardsmith-budget/data/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    assert len(_fetched(faults)) == FILES
