"""Inputs from S3 (issue 15, part 1), against a real S3 server: moto in server mode on a free port.

Every run from ``s3://`` is compared with the same command on a local copy laid out the same way:
the shards are byte-identical, and the manifests equal but for ``created``, ``command`` and the
input root URL. No client library is mocked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import (
    Stall,
    free_port,
    jpeg_folder,
    make_docs,
    run_cli,
    run_subprocess,
    same_dataset,
    two_file_corpus,
    write_jsonl,
)

from shardsmith.errors import install_hint

pytest.importorskip("s3fs", reason="S3 inputs need s3fs (pip install 'shardsmith[s3]')")
boto3 = pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

KEYS = {"AWS_ACCESS_KEY_ID": "shardsmith-test-key", "AWS_SECRET_ACCESS_KEY": "shardsmith-test-secret-42",
        "AWS_DEFAULT_REGION": "us-east-1"}




@pytest.fixture(scope="module")
def s3_env() -> dict[str, str]:
    """A moto S3 server for the module; the variables that point every client at it."""
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    try:
        server.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"moto's S3 server did not start: {exc}")
    yield {**KEYS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    server.stop()


@pytest.fixture
def s3(s3_env, monkeypatch):
    """A boto3 client on the server, with the variables set for in-process runs of the CLI."""
    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    return boto3.client("s3")


def _upload(client, bucket: str, local: Path, prefix: str) -> None:
    """Every file below ``local`` to ``s3://bucket/prefix/REL`` (made once per bucket)."""
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
    for p in sorted(local.rglob("*")):
        if p.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{p.relative_to(local).as_posix()}", Body=p.read_bytes())




def test_convert_jsonl_from_s3_equals_local(s3, tmp_path):
    local = tmp_path / "corpus"
    write_jsonl(local / "a.jsonl", make_docs(120, seed=1))
    write_jsonl(local / "sub" / "b.jsonl", make_docs(80, seed=2))
    _upload(s3, "shardsmith-jsonl", local, "data")
    s3.put_object(Bucket="shardsmith-jsonl", Key="data/notes.txt", Body=b"not an input")
    common = ["--to", "webdataset", "--workers", "2", "--seed", "7", "--split", "train=0.8,val=0.2", "-q"]
    ref = run_cli("convert", local, "-o", tmp_path / "ref", *common)
    assert ref.exit_code == 0, ref.stderr
    got = run_cli("convert", "s3://shardsmith-jsonl/data/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    manifest = orjson.loads((tmp_path / "got" / "manifest.json").read_bytes())
    assert manifest["source"]["inputs"] == ["a.jsonl", "sub/b.jsonl"]
    assert manifest["source"]["input_root"] == "s3://shardsmith-jsonl/data/"
    assert not (tmp_path / ".got.shardsmith-work").exists(), "the staged inputs go with the scratch folder"
    # one object: its identity is its name, as for a local file
    one = run_cli("convert", "s3://shardsmith-jsonl/data/a.jsonl", "-o", tmp_path / "one", *common)
    ref_one = run_cli("convert", local / "a.jsonl", "-o", tmp_path / "ref-one", *common)
    assert one.exit_code == 0 and ref_one.exit_code == 0, one.stderr + ref_one.stderr
    same_dataset(tmp_path / "ref-one", tmp_path / "one")


def test_image_folder_from_s3_keeps_classes(s3, tmp_path):
    local = jpeg_folder(tmp_path / "images", classes=3, per_class=4)
    _upload(s3, "shardsmith-images", local, "images")
    common = ["--to", "webdataset", "--workers", "1", "-q"]
    assert run_cli("convert", local, "-o", tmp_path / "ref", *common).exit_code == 0
    got = run_cli("convert", "s3://shardsmith-images/images/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    assert orjson.loads((tmp_path / "got" / "manifest.json").read_bytes())["classes"] == ["c0", "c1", "c2"]


def test_pack_tokens_from_s3_glob_equals_local(s3, tmp_path, bpe_tokenizer):
    local = tmp_path / "text"
    write_jsonl(local / "a.jsonl", make_docs(150, seed=3))
    write_jsonl(local / "b.jsonl", make_docs(90, seed=4))
    write_jsonl(local / "skip.json", make_docs(5, seed=5))
    _upload(s3, "shardsmith-text", local, "data")
    common = ["--tokenizer", bpe_tokenizer, "--workers", "2", "--shard-tokens", "4K", "-q"]
    ref = run_cli("pack-tokens", local / "a.jsonl", local / "b.jsonl", "-o", tmp_path / "ref", *common)
    assert ref.exit_code == 0, ref.stderr
    got = run_cli("pack-tokens", "s3://shardsmith-text/data/*.jsonl", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    # an object named twice (by the glob and by itself) is read once, and a line says so
    twice = run_cli("pack-tokens", "s3://shardsmith-text/data/*.jsonl", "s3://shardsmith-text/data/a.jsonl", "-o",
                    tmp_path / "twice", *common)
    assert twice.exit_code == 0 and twice.stderr == (
        "shardsmith: warning: inputs named more than once are read once: s3://shardsmith-text/data/a.jsonl: 1 file "
        "also named by s3://shardsmith-text/data/*.jsonl\n"), twice.stderr
    same_dataset(tmp_path / "ref", tmp_path / "twice")


def _stats(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def test_killed_run_resumes_without_downloading_again(s3, s3_env, tmp_path, bpe_tokenizer):
    corpus = two_file_corpus(tmp_path / "corpus", 1500, seed=3, max_words=40, first=800)
    _upload(s3, "shardsmith-resume", corpus, "corpus")
    args = ["pack-tokens", "s3://shardsmith-resume/corpus", "--tokenizer", bpe_tokenizer, "--memory", "512KB",
            "--workers", "1", "--shard-tokens", "20K", "-q"]
    env = {**os.environ, **s3_env}
    out = tmp_path / "out"
    # tasks run in a worker while inputs arrive (even --workers 1): the worker takes the run down with it
    killed = run_subprocess(*args, "-o", out, env={**env, "SHARDSMITH_CRASH_AT": "scatter:1",
                                                   "SHARDSMITH_CRASH_PARENT": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    staged = tmp_path / ".out.shardsmith-work" / "inputs"
    first = _stats(staged)
    assert set(first) == {"s3/shardsmith-resume/corpus/a.jsonl", "s3/shardsmith-resume/corpus/b.jsonl"}
    parts = sorted(p.name for p in (tmp_path / ".out.shardsmith-work").iterdir())
    # killed again with every shard written: the inputs were not downloaded again, the parts were reused
    again = run_subprocess(*args, "-o", out, env={**env, "SHARDSMITH_CRASH_AT": "manifest"})
    assert again.returncode == -signal.SIGKILL, again.stderr
    assert _stats(staged) == first, "a resumed run downloads nothing it has staged whole"
    assert set(parts) <= set(p.name for p in (tmp_path / ".out.shardsmith-work").iterdir())
    done = run_subprocess(*args, "-o", out, env=env)
    assert done.returncode == 0, done.stderr
    assert not staged.exists()
    ref = run_subprocess(*args[:1], corpus, *args[2:], "-o", tmp_path / "ref", env=env)
    assert ref.returncode == 0, ref.stderr
    same_dataset(tmp_path / "ref", out)


def test_torn_download_is_not_taken_for_a_whole_one(s3, tmp_path):
    local = tmp_path / "corpus"
    write_jsonl(local / "a.jsonl", make_docs(50, seed=8))
    _upload(s3, "shardsmith-torn", local, "data")
    common = ["--to", "webdataset", "--workers", "1", "-q"]
    staged = tmp_path / ".got.shardsmith-work" / "inputs" / "s3" / "shardsmith-torn" / "data"
    staged.mkdir(parents=True)
    (staged / "a.jsonl").write_bytes(b'{"text": "a torn copy"}\n')  # a copy without its ETag: not trusted
    (staged / ".a.jsonl.tmp-1-2").write_bytes(b"half")
    (staged / "stale.jsonl").write_bytes(b'{"text": "from an earlier listing"}\n')
    assert run_cli("convert", local, "-o", tmp_path / "ref", *common).exit_code == 0
    got = run_cli("convert", "s3://shardsmith-torn/data", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")


@pytest.mark.parametrize("url, says", [
    ("s3://shardsmith-no-such-bucket/data/", "s3://shardsmith-no-such-bucket/data/: no such bucket"),
    ("s3://shardsmith-errors/nothing-here.jsonl", "s3://shardsmith-errors/nothing-here.jsonl: no such object"),
    ("s3://shardsmith-errors/data/*.parquet", "s3://shardsmith-errors/data/*.parquet: no object matches"),
    ("s3://someone:hunter2@shardsmith-errors/data/", "s3://shardsmith-errors/data/: s3:// URLs carry no credentials"),
    ("az://container/data/", "az://container/data/: az:// inputs are not supported yet"),
    ("nope://bucket/data/", "nope://bucket/data/: unknown URL scheme nope://"),
])
def test_storage_errors_are_one_line(s3, tmp_path, url, says):
    if "shardsmith-errors" not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket="shardsmith-errors")
        s3.put_object(Bucket="shardsmith-errors", Key="data/a.jsonl", Body=b'{"text": "x"}\n')
    res = run_cli("convert", url, "-o", tmp_path / "out", "--to", "webdataset", "-q")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert "hunter2" not in res.stderr and KEYS["AWS_SECRET_ACCESS_KEY"] not in res.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.shardsmith-work").exists()
    for left in tmp_path.rglob("*"):  # the lock file records the command line: never with its credentials
        assert not left.is_file() or b"hunter2" not in left.read_bytes(), left


_BLOCK_S3FS = """
import sys
import time
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "s3fs":
            raise ModuleNotFoundError("No module named 's3fs'", name="s3fs")
sys.meta_path.insert(0, Block())
from shardsmith.program import main
sys.argv = ["shardsmith"] + sys.argv[1:]
main()
"""


def test_missing_s3fs_names_the_extra(s3_env, tmp_path):
    res = subprocess.run([sys.executable, "-c", _BLOCK_S3FS, "convert", "s3://bucket/data/", "-o",
                          str(tmp_path / "out"), "--to", "webdataset"], capture_output=True, text=True,
                         env={**os.environ, **s3_env}, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == ("shardsmith: error: s3://bucket/data/: reading s3:// needs s3fs: "
                                  f"{install_hint('s3')}"), res.stderr


def test_a_url_input_starts_no_more_workers_than_it_has_tasks(s3, s3_env, tmp_path, bpe_tokenizer):
    """Inputs from a URL are planned as they arrive, so the task count is not known when the workers
    start: they are as many as the inputs' bytes make tasks (one small object: one), not --workers."""
    local = tmp_path / "corpus"
    write_jsonl(local / "a.jsonl", make_docs(200, seed=3))
    _upload(s3, "shardsmith-few", local, "data")
    held = Stall(tmp_path, "scatter:0")  # never released: killed below
    env = {**os.environ, **s3_env, **held.env}
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", "pack-tokens", "s3://shardsmith-few/data/",
                             "-o", str(tmp_path / "out"), "--tokenizer", str(bpe_tokenizer), "--workers", "16",
                             "--engine", "hf", "-q"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        held.reached(proc)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1, children  # the one worker (stalled in its task); never 16
    finally:
        proc.kill()
        proc.wait()
