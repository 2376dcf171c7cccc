"""Faults of object storage (issue 15, part 4): a flaky S3 endpoint (``s3_fault_proxy``, in front of
a real moto server) fails a share of the requests with 503 SlowDown and connections closed in the
middle of a body. Runs through it finish with the bytes of a local run; an object that stays
unreadable stops the run with one line after a bounded number of attempts, or is left out and
listed with ``--on-error skip``. Only shardsmith's retries are at work (s3fs's and botocore's are
off), so the attempts counted here are ours.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest
from conftest import jpeg_folder, make_docs, run_cli, same_dataset, tree_digest, write_jsonl
from s3_fault_proxy import Faults, proxied  # noqa: F401  (a fixture)

pytest.importorskip("s3fs", reason="S3 inputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import KEYS, _upload, s3, s3_env  # noqa: E402,F401  (fixtures)

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy

FAST = ["--retry-wait", "0.01"]  # the backoff is the code's; the tests need not wait for it


@pytest.fixture
def flaky(s3, proxied):  # noqa: F811  (the fixtures imported above)
    """``(client, start)``: ``start(faults)`` points the runs at a fault proxy in front of the server."""
    return s3, proxied


def _starts(faults: Faults, key: str) -> list[int]:
    """The first byte of every ranged GET of ``key``, in the order they came."""
    return [int(r[2].split("=")[1].split("-")[0]) for r in faults.requests
            if r[0] == "GET" and urlsplit(r[1]).path.endswith("/" + key) and r[2]]


def test_jsonl_through_faults_equals_local(flaky, tmp_path, monkeypatch):
    from shardsmith.engine.inputs import url_inputs

    monkeypatch.setattr(url_inputs, "BLOCK", 32 << 10)  # a large object is many ranged reads: resets land inside it
    client, start = flaky
    local = tmp_path / "corpus"
    write_jsonl(local / "a.jsonl", make_docs(120, seed=1))
    write_jsonl(local / "sub" / "b.jsonl", make_docs(80, seed=2))
    write_jsonl(local / "big.jsonl", make_docs(2500, seed=3))
    assert (local / "big.jsonl").stat().st_size > 8 * (32 << 10)
    _upload(client, "shardsmith-faults", local, "data")
    common = ["--to", "webdataset", "--workers", "2", "--seed", "7", "--split", "train=0.8,val=0.2", "-q"]
    ref = run_cli("convert", local, "-o", tmp_path / "ref", *common)
    assert ref.exit_code == 0, ref.stderr
    faults = start(Faults(slowdown=0.12, reset=0.2, seed=2))  # ~1 request in 4 fails
    got = run_cli("convert", "s3://shardsmith-faults/data/", "-o", tmp_path / "got", *common, *FAST)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    failed = faults.count("503") + faults.count("reset")
    assert faults.count("503") and faults.count("reset") and 0.2 <= failed / len(faults.requests) <= 0.4, \
        (failed, len(faults.requests))
    starts = _starts(faults, "big.jsonl")
    assert starts == sorted(starts), "a download that broke off resumes where it was, never from the start"
    broken = [int(r[2].split("=")[1].split("-")[0]) for r in faults.requests
              if r[3] == "reset" and r[1].endswith("/big.jsonl") and r[2]]
    assert any(b > 0 for b in broken), "some reset landed in the middle of the large object"


def test_image_folder_through_faults_equals_local(flaky, tmp_path):
    client, start = flaky
    local = jpeg_folder(tmp_path / "images", classes=3, per_class=4)
    _upload(client, "shardsmith-faults-img", local, "images")
    common = ["--to", "webdataset", "--workers", "1", "-q"]
    assert run_cli("convert", local, "-o", tmp_path / "ref", *common).exit_code == 0
    faults = start(Faults(slowdown=0.12, reset=0.2))
    got = run_cli("convert", "s3://shardsmith-faults-img/images/", "-o", tmp_path / "got", *common, *FAST)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    assert faults.count("503") and faults.count("reset")


def _doomed_bucket(client, tmp_path: Path) -> Path:
    local = tmp_path / "corpus"
    write_jsonl(local / "a.jsonl", make_docs(60, seed=4))
    write_jsonl(local / "b.jsonl", make_docs(40, seed=5))
    write_jsonl(local / "bad.jsonl", make_docs(10, seed=6))
    _upload(client, "shardsmith-doomed", local, "data")
    return local


def test_unreadable_object_stops_the_run_after_bounded_retries(flaky, tmp_path):
    client, start = flaky
    _doomed_bucket(client, tmp_path)
    faults = start(Faults(doomed=("bad.jsonl",)))
    res = run_cli("convert", "s3://shardsmith-doomed/data/", "-o", tmp_path / "out", "--to", "webdataset", "-q",
                  "--retries", "3", "--retry-wait", "0.05")
    assert res.exit_code == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "s3://shardsmith-doomed/data/bad.jsonl: cannot read it after 4 attempts" in lines[0], res.stderr
    assert KEYS["AWS_SECRET_ACCESS_KEY"] not in res.stderr and KEYS["AWS_ACCESS_KEY_ID"] not in res.stderr
    assert sum(1 for r in faults.requests if r[1].endswith("/bad.jsonl")) == 4, "one request per attempt"
    assert not (tmp_path / "out").exists()


def test_unreadable_object_is_skipped_and_listed(flaky, tmp_path):
    client, start = flaky
    local = _doomed_bucket(client, tmp_path)
    (local / "bad.jsonl").unlink()
    common = ["--to", "webdataset", "--workers", "1", "-q", "--on-error", "skip"]
    assert run_cli("convert", local, "-o", tmp_path / "ref", *common).exit_code == 0
    start(Faults(doomed=("bad.jsonl",)))
    res = run_cli("convert", "s3://shardsmith-doomed/data/", "-o", tmp_path / "got", *common, "--retries", "2",
                  *FAST)
    assert res.exit_code == 0, res.stderr
    assert tree_digest(tmp_path / "ref") == tree_digest(tmp_path / "got")
    source = orjson.loads((tmp_path / "got" / "manifest.json").read_bytes())["source"]
    assert source["inputs"] == ["a.jsonl", "b.jsonl"]
    assert [s["url"] for s in source["skipped_inputs"]] == ["s3://shardsmith-doomed/data/bad.jsonl"]
    assert "after 3 attempts" in source["skipped_inputs"][0]["reason"]
    assert KEYS["AWS_SECRET_ACCESS_KEY"] not in orjson.dumps(source).decode()
    assert res.output.strip().endswith("; 1 input object skipped (--on-error skip), listed in the manifest"), \
        res.output
    shown = run_cli("inspect", tmp_path / "got", "--samples", "0")
    assert shown.exit_code == 0, shown.stderr
    assert "  skipped inputs (--on-error skip): 1: s3://shardsmith-doomed/data/bad.jsonl" in shown.output, shown.output
    as_json = orjson.loads(run_cli("inspect", tmp_path / "got", "--json", "--samples", "0").output)
    assert as_json["source"]["skipped_inputs"] == source["skipped_inputs"]


def test_pack_tokens_skips_an_unreadable_object(flaky, tmp_path, bpe_tokenizer):
    client, start = flaky
    local = _doomed_bucket(client, tmp_path)
    (local / "bad.jsonl").unlink()
    common = ["--tokenizer", bpe_tokenizer, "--workers", "1", "--shard-tokens", "4K", "--on-error", "skip"]
    ref = run_cli("pack-tokens", local, "-o", tmp_path / "ref", "-q", *common)
    assert ref.exit_code == 0, ref.stderr
    start(Faults(doomed=("bad.jsonl",)))
    res = run_cli("pack-tokens", "s3://shardsmith-doomed/data/", "-o", tmp_path / "got", "-q", *common,
                  "--retries", "1", *FAST)
    assert res.exit_code == 0, res.stderr
    assert tree_digest(tmp_path / "ref") == tree_digest(tmp_path / "got")
    source = orjson.loads((tmp_path / "got" / "manifest.json").read_bytes())["source"]
    assert source["inputs"] == ["a.jsonl", "b.jsonl"]
    assert source["skipped_inputs"] == [{"url": "s3://shardsmith-doomed/data/bad.jsonl", "reason": source[
        "skipped_inputs"][0]["reason"]}]
    assert "cannot read it after 2 attempts" in source["skipped_inputs"][0]["reason"]
    assert "1 input object skipped (--on-error skip), listed in the manifest" in res.output, res.output


def test_an_unlistable_input_stops_the_run_even_with_skip(flaky, tmp_path):
    """Of two prefixes, one stays unlistable: the set of inputs is unknown, so the run stops
    (docs/design.md: listing errors always stop), with one line saying how many attempts were made."""
    client, start = flaky
    local = tmp_path / "corpus"
    write_jsonl(local / "one" / "a.jsonl", make_docs(30, seed=1))
    write_jsonl(local / "two" / "b.jsonl", make_docs(30, seed=2))
    _upload(client, "shardsmith-two-prefixes", local, "data")
    faults = start(Faults(doomed=("two",)))  # every request naming the prefix data/two
    res = run_cli("convert", "s3://shardsmith-two-prefixes/data/one/", "s3://shardsmith-two-prefixes/data/two/",
                  "-o", tmp_path / "out", "--to", "webdataset", "-q", "--on-error", "skip", "--retries", "2", *FAST)
    assert res.exit_code == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        "shardsmith: error: s3://shardsmith-two-prefixes/data/two/: cannot list it after 3 attempts (the last: "
        "OSError: [Errno 16] Service Unavailable)"], res.stderr
    assert faults.count("503") == 3
    assert not (tmp_path / "out").exists()


def test_no_retries_fail_fast(flaky, tmp_path):
    client, start = flaky
    _doomed_bucket(client, tmp_path)
    faults = start(Faults(slowdown=1.0))  # every request
    res = run_cli("convert", "s3://shardsmith-doomed/data/", "-o", tmp_path / "out", "--to", "webdataset", "-q",
                  "--retries", "0")
    assert res.exit_code == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "s3://shardsmith-doomed/data/: cannot list it after 1 attempt " in lines[0], res.stderr
    assert len(faults.requests) == 1, faults.requests


def test_permanent_errors_are_not_retried(flaky, tmp_path):
    _, start = flaky
    faults = start(Faults())
    res = run_cli("convert", "s3://shardsmith-no-such-bucket-2/data/", "-o", tmp_path / "out", "--to",
                  "webdataset", "-q", "--retries", "5", "--retry-wait", "5")
    assert res.exit_code == 2 and "no such bucket" in res.stderr, res.stderr
    assert len(faults.requests) <= 2, faults.requests  # s3fs may ask twice (list, then head), never 6 times


def test_pack_tokens_glob_through_faults_equals_local(flaky, tmp_path, bpe_tokenizer):
    client, start = flaky
    local = tmp_path / "text"
    write_jsonl(local / "a.jsonl", make_docs(150, seed=3))
    write_jsonl(local / "b.jsonl", make_docs(90, seed=4))
    _upload(client, "shardsmith-faults-text", local, "data")
    common = ["--tokenizer", bpe_tokenizer, "--workers", "2", "--shard-tokens", "4K", "-q"]
    ref = run_cli("pack-tokens", local / "a.jsonl", local / "b.jsonl", "-o", tmp_path / "ref", *common)
    assert ref.exit_code == 0, ref.stderr
    faults = start(Faults(slowdown=0.12, reset=0.2, seed=2))
    got = run_cli("pack-tokens", "s3://shardsmith-faults-text/data/*.jsonl", "-o", tmp_path / "got", *common, *FAST)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    assert faults.count("503") and faults.count("reset")


SECRET, TOKEN, SIGNATURE = "s3cr3t-never-shown-7f3a", "t0ken-never-shown-91c2", "sig-never-shown-5d0e"


def test_credentials_and_signatures_never_appear(flaky, tmp_path, monkeypatch):
    """Secret keys and session tokens in the environment, signatures and tokens in URL queries,
    credentials in a URL's userinfo, through runs that skip, fail and are refused: none of them is
    in any output, error, manifest, lock or scratch file (the runs are child processes: all they
    write is seen)."""
    import importlib.util

    from conftest import run_subprocess

    client, start = flaky
    _doomed_bucket(client, tmp_path / "in")
    start(Faults(doomed=("bad.jsonl",)))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # moto takes any signature: the runs still work
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    common = ["--to", "webdataset", "--workers", "1", "--retries", "1", "--retry-wait", "0.01"]
    runs = [
        (0, ["s3://shardsmith-doomed/data/", "-o", tmp_path / "skipped", "--on-error", "skip"]),
        (1, ["s3://shardsmith-doomed/data/", "-o", tmp_path / "failed"]),
        (2, [f"s3://shardsmith-doomed/data/a.jsonl?X-Amz-Credential=AKIAEXAMPLE%2F{TOKEN}&X-Amz-Signature="
             f"{SIGNATURE}", "-o", tmp_path / "query"]),
        (2, [f"https://shardsmith-doomed.s3.amazonaws.com/data/a.jsonl?X-Amz-Security-Token={TOKEN}&"
             f"X-Amz-Signature={SIGNATURE}", "-o", tmp_path / "presigned"]),
        (2, [f"s3://AKIAEXAMPLE:{SECRET}@shardsmith-doomed/data/", "-o", tmp_path / "userinfo"]),
    ]
    if importlib.util.find_spec("fsspec_xrootd") is not None:  # a token in an XRootD URL, no server there
        from test_xrootd_inputs import free_port

        runs.append((1, [f"root://localhost:{free_port()}//data/a.jsonl?authz={TOKEN}", "-o", tmp_path / "xrd"]))
    seen = [_killed_while_staging(tmp_path / "killed", common)]
    for code, args in runs:
        res = run_subprocess("convert", *args, *common, env=dict(os.environ))
        assert res.returncode == code, (args, res.stderr)
        seen.append((f"stdout of {args[0]}", res.stdout))
        seen.append((f"stderr of {args[0]}", res.stderr))
    assert "skipped_inputs" in (tmp_path / "skipped" / "manifest.json").read_text()
    files = [p for p in tmp_path.rglob("*") if p.is_file() and "in" not in p.relative_to(tmp_path).parts[:1]]
    assert any(p.name == "manifest.json" for p in files), files
    assert any(".killed.shardsmith-work" in p.parts for p in files), files  # the killed run's scratch and lock
    seen += [(str(p), p.read_bytes().decode(errors="replace")) for p in files]
    for where, text in seen:
        for secret in (SECRET, TOKEN, SIGNATURE):
            assert secret not in text, f"{secret} in {where}"


def _killed_while_staging(out: Path, common: list[str]) -> tuple[str, str]:
    """A run killed while it waits to retry an object (the others staged): its lock and scratch
    files stay; returns what it printed."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", "convert", "s3://shardsmith-doomed/data/", "-o",
                             str(out), *common, "--retries", "5", "--retry-wait", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    scratch = out.parent / f".{out.name}.shardsmith-work"
    deadline = time.monotonic() + 300  # a bound for a hung run only: a loaded machine may take long
    while not any(p.name == "a.jsonl" and "inputs.etags" in p.parts for p in scratch.rglob("*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    return "output of the killed run", stdout + stderr
