"""The run record as a lease on an output prefix (issue 26 item 2; ``engine/output/outhold.py``).

Two runs into one prefix, as from two machines (two staging folders): a run whose record is kept
fresh by its heartbeat is not replaced, even with ``--overwrite``; a run whose record was replaced
meanwhile commits nothing; a stale record is taken over, and the unfinished uploads of the prefix
that are not a dead run's are never aborted. Run 1 is caught in the middle with the stall hook
(``SHARDSMITH_STALL_AT``), a subprocess, as a user runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from conftest import Stall, run_cli

pytest.importorskip("s3fs", reason="S3 outputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import s3, s3_env  # noqa: E402,F401  (fixtures)
from test_s3_outputs import _bucket, _download, _keys, _pack, corpus, store  # noqa: E402,F401  (fixtures)

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy

RECORD = ".shardsmith-run.json"


def _stalled(args: list, tmp_path: Path, point: str) -> tuple[subprocess.Popen, Stall]:
    """Run 1 in a subprocess, held at ``point`` until the test releases it; returns once it is there."""
    held = Stall(tmp_path, point)
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", *map(str, args)], env={**os.environ, **held.env},
                            stderr=subprocess.PIPE, text=True)
    held.reached(proc)
    return proc, held


def _record(client, bucket: str, prefix: str) -> dict:
    return orjson.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/{RECORD}")["Body"].read())


def _uploads(client, bucket: str, prefix: str) -> set[str]:
    return {u["UploadId"] for u in client.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", [])}


def test_a_live_run_keeps_its_prefix_even_from_overwrite(store, corpus, bpe_tokenizer, tmp_path):  # noqa: F811
    """The adversarial race: run 2 (--overwrite, another seed and staging folder) while run 1 has
    uploaded everything but its manifest. Run 2 is refused in one line naming run 1; run 1 commits."""
    client, _ = store
    bucket = _bucket(client, "hold-live")
    url = f"s3://{bucket}/x"
    one = _pack(corpus, url, bpe_tokenizer, "--seed", "1", "--staging", tmp_path / "A")
    proc, held = _stalled(one, tmp_path, "uploaded-all")
    res = run_cli(*_pack(corpus, url, bpe_tokenizer, "--seed", "2", "--staging", tmp_path / "B", "--overwrite"))
    held.release()
    assert res.exit_code != 0, res.stderr
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and "another run is writing into it" in line, line
    assert f"pid {proc.pid} on {socket.gethostname()}" in line, line
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    got = _download(client, bucket, "x", tmp_path / "got")
    assert orjson.loads((got / "manifest.json").read_bytes())["seed"] == 1
    assert run_cli("verify", got).exit_code == 0


def test_a_run_whose_record_was_replaced_commits_nothing(store, corpus, bpe_tokenizer, tmp_path):  # noqa: F811
    client, _ = store
    bucket = _bucket(client, "hold-lost")
    proc, held = _stalled(_pack(corpus, f"s3://{bucket}/x", bpe_tokenizer, "--staging", tmp_path / "A"), tmp_path,
                          "uploaded-all")
    theirs = {**_record(client, bucket, "x"), "host": "elsewhere", "pid": 4242, "token": "theirs",
              "beat": time.time()}
    client.put_object(Bucket=bucket, Key=f"x/{RECORD}", Body=orjson.dumps(theirs))
    held.release()
    assert proc.wait(timeout=300) == 1
    line = proc.stderr.read().strip()
    assert len(line.splitlines()) == 1 and "lost its prefix to another run" in line and "pid 4242 on elsewhere" in line
    assert "nothing committed" in line, line
    keys = _keys(client, bucket, "x")
    assert "manifest.json" not in keys and _record(client, bucket, "x")["token"] == "theirs", "theirs is kept"
    assert not (tmp_path / "A").exists() or not any((tmp_path / "A").iterdir())


def test_a_stale_record_is_taken_over_and_only_dead_uploads_are_aborted(store, corpus, bpe_tokenizer,  # noqa: F811
                                                                        tmp_path):
    """A run elsewhere left its record: while its heartbeat is fresh, --overwrite is refused; once
    stale, taken over (one line says so). Unfinished uploads: the dead run's (found at the claim, an
    own name) are aborted; another tool's (a foreign name) and one begun after the claim are not."""
    client, _ = store
    bucket = _bucket(client, "hold-stale")
    url = f"s3://{bucket}/x"
    theirs = {"command": "pack-tokens", "options": "other", "inputs": "other", "host": "elsewhere", "pid": 4242,
              "token": "theirs", "started": "2026-01-01T00:00:00+00:00", "beat": time.time()}
    client.put_object(Bucket=bucket, Key=f"x/{RECORD}", Body=orjson.dumps(theirs))
    client.put_object(Bucket=bucket, Key="x/train-000005.bin", Body=b"half a shard of theirs")
    dead = client.create_multipart_upload(Bucket=bucket, Key="x/train-000007.bin")["UploadId"]
    other_tool = client.create_multipart_upload(Bucket=bucket, Key="x/notes/big.bin")["UploadId"]
    args = _pack(corpus, url, bpe_tokenizer, "--overwrite", "--staging", tmp_path / "A")
    res = run_cli(*args)
    assert res.exit_code != 0 and "pid 4242 on elsewhere" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and _record(client, bucket, "x")["token"] == "theirs"
    client.put_object(Bucket=bucket, Key=f"x/{RECORD}", Body=orjson.dumps({**theirs, "beat": time.time() - 3600}))
    proc, held = _stalled(args, tmp_path, "claimed")
    late = client.create_multipart_upload(Bucket=bucket, Key="x/train-000099.bin")["UploadId"]
    held.release()
    assert proc.wait(timeout=300) == 0
    said = proc.stderr.read()
    assert "took the prefix over" in said and "pid 4242 on elsewhere" in said and "heartbeat" in said, said
    assert "train-000005.bin" not in _keys(client, bucket, "x") and RECORD not in _keys(client, bucket, "x")
    assert _uploads(client, bucket, "x") == {other_tool, late} and dead not in _uploads(client, bucket, "x")
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer)).exit_code == 0
    from conftest import same_dataset

    same_dataset(tmp_path / "ref", _download(client, bucket, "x", tmp_path / "got"))


def test_a_container_beside_us_is_judged_by_its_heartbeat(store, corpus, bpe_tokenizer, tmp_path):  # noqa: F811
    """Containers on one machine (host networking) share its host name but not its pids: a holder
    with our host name but another pid namespace is live while its heartbeat is fresh, whatever
    pid it names (1, as a container's entry point, or one that does not run here)."""
    from shardsmith.engine.output import outhold
    from shardsmith.engine.output.outlock import pid_space

    client, _ = store
    bucket = _bucket(client, "hold-beside")
    url = f"s3://{bucket}/x"
    here = socket.gethostname()
    for pid in (1, os.getpid(), 4_000_000):
        theirs = {"command": "pack-tokens", "options": "o", "inputs": "i", "host": here, "pid": pid,
                  "pids": "another-boot:4026531836", "token": "theirs", "started": "2026-01-01T00:00:00+00:00",
                  "beat": time.time()}
        assert outhold.state(theirs) == "live"
        assert outhold.state({**theirs, "beat": time.time() - 3600}) == "stale"
        assert outhold.state({**theirs, "pids": pid_space(), "pid": 4_000_000}) == "dead"  # ours: its pid test
    client.put_object(Bucket=bucket, Key=f"x/{RECORD}", Body=orjson.dumps({**theirs, "pid": 1}))
    res = run_cli(*_pack(corpus, url, bpe_tokenizer, "--overwrite", "--staging", tmp_path / "A"))
    assert res.exit_code == 1 and f"pid 1 on {here}" in res.stderr, res.stderr
    assert _record(client, bucket, "x")["token"] == "theirs"


def _frozen_run_one(client, name: str, inputs, bpe_tokenizer, tmp_path: Path, monkeypatch) -> tuple:
    """(bucket, url, what run 1 made in its staging folder, run 1's session): run 1 driven in this
    process through the engine's own session, its heartbeat frozen (it tells run 1 nothing)."""
    from shardsmith.engine.output import outhold
    from shardsmith.engine.output.outremote import output_store, remote_session

    bucket = _bucket(client, name)
    url = f"s3://{bucket}/x"
    made = tmp_path / "made"  # what run 1 makes in its staging folder
    assert run_cli(*_pack(inputs, made, bpe_tokenizer, "--seed", "1")).exit_code == 0
    monkeypatch.setattr(outhold, "HEARTBEAT_SECONDS", 3600.0)
    (tmp_path / "A").mkdir()
    one = remote_session(url=url, staging=tmp_path / "A", overwrite=False, quiet=True,
                         store=output_store(url=url, retries=0, retry_wait=0.01, part_size=None))
    return bucket, url, made, one


def test_a_run_that_lost_its_prefix_cannot_write_into_it(store, corpus, bpe_tokenizer, tmp_path,  # noqa: F811
                                                         monkeypatch):
    """Issue 42 item 3: run 1 is frozen (its heartbeat too) with its prefix claimed; another
    machine's run takes the prefix over with --overwrite and commits; then run 1 goes on with the
    uploads it had started. Its writes are refused by the store (conditional puts and deletes), it
    stops in one line, and the other run's dataset is whole: no object replaced or removed, no
    manifest of run 1's. Run 1 is driven in this process, through the engine's own session, so
    that nothing depends on timing."""
    import hashlib
    import shutil

    from shardsmith.engine.output.outlock import LockedError
    from shardsmith.engine.output.session import held
    from shardsmith.kit import manifest_io

    client, _ = store
    bucket, url, made, one = _frozen_run_one(client, "hold-fenced", corpus, bpe_tokenizer, tmp_path, monkeypatch)
    with pytest.raises(LockedError) as err, held(one):
        one.claim({"command": "pack-tokens", "options": "--seed 1", "inputs": "corpus"})
        opened = [u["UploadId"] for u in client.list_multipart_uploads(Bucket=bucket, Prefix="x/").get("Uploads", [])
                  if u["Key"] == "x/manifest.json"]  # the upload that would commit run 1's manifest
        # run 1's record as a frozen machine leaves it: its heartbeat an hour old
        frozen = {**_record(client, bucket, "x"), "host": "elsewhere", "beat": time.time() - 3600}
        client.put_object(Bucket=bucket, Key=f"x/{RECORD}", Body=orjson.dumps(frozen))
        res = run_cli(*_pack(corpus, url, bpe_tokenizer, "--seed", "2", "--staging", tmp_path / "B", "--overwrite"))
        assert res.exit_code == 0 and "took the prefix over" in res.stderr, res.stderr
        theirs = _keys(client, bucket, "x")
        for rel in sorted(p.relative_to(made).as_posix() for p in made.rglob("*")
                          if p.is_file() and p.name != "manifest.json"):
            (tmp_path / "A" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(made / rel, tmp_path / "A" / f".{rel}.part")
            os.replace(tmp_path / "A" / f".{rel}.part", tmp_path / "A" / rel)  # (as the writers rename)
        one.commit(manifest_io.load(made))  # run 1 goes on: its uploads, then its manifest
    line = str(err.value)
    assert "\n" not in line and "lost its prefix to another run" in line and "nothing committed" in line, line
    assert _keys(client, bucket, "x") == theirs, "no object of the other run replaced or removed"
    got = _download(client, bucket, "x", tmp_path / "got")
    manifest = orjson.loads((got / "manifest.json").read_bytes())
    assert manifest["seed"] == 2
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            assert hashlib.sha256((got / shard["path"]).read_bytes()).hexdigest() == shard["sha256"]
    assert run_cli("verify", got).exit_code == 0
    # frozen right after its last check, run 1 could not commit either: its manifest upload was aborted
    from shardsmith.storage.objstore import Changed

    assert len(opened) == 1, opened
    with pytest.raises(Changed, match="aborted"):
        one.store.commit("manifest.json", opened[0], (made / "manifest.json").read_bytes())
    assert _keys(client, bucket, "x") == theirs


def test_a_run_that_lost_its_prefix_and_failed_removes_nothing_of_the_new_run(store, corpus, bpe_tokenizer,  # noqa: F811
                                                                              tmp_path, monkeypatch):
    """Run 1 puts its files into a fresh prefix and is frozen; another machine's run takes the prefix
    over with --overwrite and commits the same bytes (the same seed: objects of the same ETags); then
    run 1 fails (a bad record) before anything asked whether the prefix is still its own. A failed
    run removes what it put in a fresh prefix, each object only if it still has the ETag it put, and
    the other run's objects have those very ETags: it must ask first, and remove nothing."""
    import shutil

    from shardsmith.engine.output.session import held
    from shardsmith.errors import DataError

    client, _ = store
    bucket, url, made, one = _frozen_run_one(client, "hold-failed", corpus, bpe_tokenizer, tmp_path, monkeypatch)
    with pytest.raises(DataError, match="a bad record"), held(one):
        one.claim({"command": "pack-tokens", "options": "--seed 1", "inputs": "corpus"})
        for rel in sorted(p.relative_to(made).as_posix() for p in made.rglob("*")
                          if p.is_file() and p.name != "manifest.json"):
            (tmp_path / "A" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(made / rel, tmp_path / "A" / f".{rel}.part")
            os.replace(tmp_path / "A" / f".{rel}.part", tmp_path / "A" / rel)  # (as the writers rename)
        assert one.uploader.finish()  # run 1's files are up
        frozen = {**_record(client, bucket, "x"), "host": "elsewhere", "beat": time.time() - 3600}
        client.put_object(Bucket=bucket, Key=f"x/{RECORD}", Body=orjson.dumps(frozen))
        res = run_cli(*_pack(corpus, url, bpe_tokenizer, "--seed", "1", "--staging", tmp_path / "B", "--overwrite"))
        assert res.exit_code == 0 and "took the prefix over" in res.stderr, res.stderr
        theirs = _keys(client, bucket, "x")
        raise DataError(file="corpus", reason="a bad record")  # run 1 goes on, and fails
    assert _keys(client, bucket, "x") == theirs, "no object of the other run removed"
    assert run_cli("verify", _download(client, bucket, "x", tmp_path / "got")).exit_code == 0
