"""Cluster stages on inputs from S3 (issue 15, part 1): each scatter rank stages only the inputs of its
own tasks, into a folder of its own inside the shared scratch folder (ranks never replace a file
another reads), and scatter, gather and finalize make the shards of a one-process run on the local
files.
"""

from __future__ import annotations

import pytest
from conftest import make_docs, run_cli, tree_digest, write_jsonl
from test_stages import one_process, staged

pytest.importorskip("s3fs", reason="S3 inputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import _upload, s3, s3_env  # noqa: E402,F401  (fixtures)

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy


@pytest.mark.parametrize("command", ["pack-tokens", "convert"])
def test_stages_from_s3_equal_the_local_run(s3, tmp_path, bpe_tokenizer, command):  # noqa: F811
    local = tmp_path / "corpus"
    for i in range(6):  # each under one task's size: a file is one task, task i of rank i mod 3
        write_jsonl(local / f"part-{i}.jsonl", make_docs(60, seed=i, max_words=30))
    _upload(s3, "shardsmith-stages", local, "corpus")
    options = (["--tokenizer", bpe_tokenizer, "--shard-tokens", "5K"] if command == "pack-tokens" else
               ["--to", "webdataset", "--shard-samples", "50"])
    common = [*options, "--memory", "1MB", "--split", "train=0.8,val=0.2", "-q"]
    one_process([command, local, *common], tmp_path / "one")
    url = "s3://shardsmith-stages/corpus/"
    out = tmp_path / "staged"
    for rank in (0, 1):  # rank 0 first: the work done once per run (the plan, pack-tokens' engine check) is done
        res = run_cli(command, url, *common, "-o", out, "--stage", "scatter", "--rank", str(rank), "--world-size", "3")
        assert res.exit_code == 0, res.stderr
    mine = tmp_path / ".staged.shardsmith-work" / "rank-1" / "inputs" / "s3" / "shardsmith-stages" / "corpus"
    assert sorted(p.name for p in mine.iterdir()) == ["part-1.jsonl", "part-4.jsonl"], "rank 1 reads tasks 1 and 4"
    staged([command, url, *common], out, 3)
    assert tree_digest(out) == tree_digest(tmp_path / "one")
