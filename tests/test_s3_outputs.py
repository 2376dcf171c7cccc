"""Outputs to object storage (issue 15, part 2), against a real S3 server (moto in server mode).

Every run into ``s3://`` is compared with the same command into a local folder: every object,
downloaded, has the sha256 of the local file, and the manifests are equal but for ``created`` and
``command``. Runs killed (SIGKILL) while converting, between uploads, inside a multipart upload and
after the manifest resume against the bucket without uploading again what is there; the requests
are counted by the fault proxy (``s3_fault_proxy``) in front of the server, here failing nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from conftest import (
    Stall,
    make_docs,
    root_data,
    run_cli,
    run_subprocess,
    same_dataset,
    tree_digest,
    two_file_corpus,
    write_jsonl,
)
from folder_format import LENGTHS, SAMPLES, registered
from s3_fault_proxy import Faults, fault_proxy

from shardsmith.errors import install_hint
from shardsmith.testing.runs import run_killed

pytest.importorskip("s3fs", reason="S3 outputs need s3fs (pip install 'shardsmith[s3]')")
pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import KEYS, s3, s3_env  # noqa: E402,F401  (fixtures)

# many processes a test (DataLoader workers, killed ranks, an S3 server, a browser) or long: `make test-heavy`
pytestmark = pytest.mark.heavy

PART = 64 << 10  # multipart uploads of 64 KiB parts: the shards here are several parts long


def _small_parts(monkeypatch, tmp_path: Path) -> None:
    """Parts of 64 KiB (the server's minimum lowered to match), a private cache for the staging
    folders, and quiet proxy threads when a killed run's connections go away."""
    import socketserver

    import moto.s3.models

    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 1024)
    monkeypatch.setenv("SHARDSMITH_PART_SIZE", str(PART))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(socketserver.BaseServer, "handle_error", lambda *a: None)


@pytest.fixture
def store(s3, s3_env, monkeypatch, tmp_path):  # noqa: F811  (the fixtures imported above)
    """``(client, faults)``: runs go through a proxy that counts their requests; small parts; a
    private cache for the staging folders."""
    _small_parts(monkeypatch, tmp_path)
    faults = Faults()
    with fault_proxy(s3_env["AWS_ENDPOINT_URL"], faults) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        yield s3, faults


def _bucket(client, name: str) -> str:
    if name not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=name)
    return name


def _download(client, bucket: str, prefix: str, dest: Path, *, folders: bool = False) -> Path:
    """The objects below ``prefix``: the built-in formats' at the top and in the index folder only
    (``folders``: a format that writes folders of its own)."""
    dest.mkdir(parents=True, exist_ok=True)
    for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", []):
        rel = o["Key"][len(prefix) + 1:]
        assert folders or rel.rpartition("/")[0] in ("", "__index__"), rel  # the dataset's files, its index folder
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
    return dest


def _keys(client, bucket: str, prefix: str) -> dict[str, str]:
    return {o["Key"][len(prefix) + 1:]: o["ETag"]
            for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])}


def _puts(faults: Faults, since: int = 0) -> list[tuple[str, int | None]]:
    """(object name, part number or None) of every PUT since request ``since``."""
    out = []
    for method, path, _, _ in faults.requests[since:]:
        if method == "PUT":
            parts = urlsplit(path)
            number = parse_qs(parts.query).get("partNumber")
            out.append((parts.path.rsplit("/", 1)[-1], int(number[0]) if number else None))
    return out


def _settled(faults: Faults) -> None:
    """Wait until the proxy has logged the requests a killed run left in flight (it logs each when
    the server has answered it)."""
    import time

    seen = -1
    while seen != len(faults.requests):
        seen = len(faults.requests)
        time.sleep(0.3)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """About 400 KB of JSONL in two files: shards of several parts, several tasks at --memory 512KB."""
    return two_file_corpus(tmp_path_factory.mktemp("s3out-corpus"), 3000, seed=3, max_words=50, first=1700)


def _pack(corpus: Path, out: str | Path, tokenizer: Path, *extra: str) -> list[str | Path]:
    return ["pack-tokens", corpus, "-o", out, "--tokenizer", tokenizer, "--memory", "512KB", "--workers", "1",
            "--split", "train=0.9,val=0.1", "--shard-tokens", "60K", "-q", "--retry-wait", "0.01", *extra]


def test_pack_tokens_to_s3_equals_local_and_loads(store, corpus, bpe_tokenizer, tmp_path):
    client, faults = store
    bucket = _bucket(client, "out-tokens")
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer)).exit_code == 0
    res = run_cli(*_pack(corpus, f"s3://{bucket}/runs/tok", bpe_tokenizer))
    assert res.exit_code == 0, res.stderr
    assert any(number == 2 for _, number in _puts(faults)), "the shards went up in several parts"
    got = _download(client, bucket, "runs/tok", tmp_path / "got")
    assert ".shardsmith-run.json" not in os.listdir(got)
    same_dataset(tmp_path / "ref", got)
    assert run_cli("verify", got).exit_code == 0
    from shardsmith.loader import open as open_dataset

    ds = open_dataset(got, split="train")
    assert len(ds) > 0
    assert not list((tmp_path / "cache").rglob("*.bin")), "the staging folder goes once the dataset is up"


def test_convert_webdataset_to_s3_equals_local(store, tmp_path):
    client, _ = store
    bucket = _bucket(client, "out-wds")
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(1500, seed=1))
    write_jsonl(tmp_path / "in" / "b.jsonl", make_docs(900, seed=2))
    common = ["--to", "webdataset", "--text-field", "text", "--shard-bytes", "150KB", "--split",
              "train=0.8,val=0.2", "-q", "--workers", "2"]
    assert run_cli("convert", tmp_path / "in", "-o", tmp_path / "ref", *common).exit_code == 0
    res = run_cli("convert", tmp_path / "in", "-o", f"s3://{bucket}/wds", *common)
    assert res.exit_code == 0, res.stderr
    got = _download(client, bucket, "wds", tmp_path / "got")
    same_dataset(tmp_path / "ref", got)
    assert run_cli("verify", got).exit_code == 0
    # the dataset card goes up with the shards; only its command line differs (-o names the bucket)
    card, ref = ((d / "README.md").read_text().split("## Command")[0] for d in (got, tmp_path / "ref"))
    assert card == ref and f"shardsmith convert in -o s3://{bucket}/wds --to webdataset" in (got / "README.md").read_text()
    # the indexes go up below __index__/, beside no shard; --overwrite removes them with the rest
    keys = set(_keys(client, bucket, "wds"))
    assert {"__index__/train.wids.json", "__index__/val.wids.json", "__index__/val-000000.offsets.npy"} <= keys
    assert not [k for k in keys if k.endswith((".npy", ".wids.json")) and not k.startswith("__index__/")]
    res = run_cli("convert", tmp_path / "in", "-o", f"s3://{bucket}/wds", *common[:4], "-q", "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert sorted(k for k in _keys(client, bucket, "wds") if k.startswith("__index__/")) == [
        "__index__/train-000000.offsets.npy", "__index__/train.wids.json"], "the val split's indexes are gone"


def test_convert_parquet_to_s3_equals_local(store, tmp_path):
    """A format declared by its own files alone (``{split}-N.parquet``) goes up whole, and --overwrite
    takes what it made away: the generic machinery, no word of Parquet in it."""
    client, _ = store
    bucket = _bucket(client, "out-parquet")
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(300, seed=3))
    common = ["--to", "parquet", "--text-field", "text", "--shard-samples", "70", "--row-group-rows", "20",
              "--split", "train=0.8,val=0.2", "-q", "--workers", "2"]
    assert run_cli("convert", tmp_path / "in", "-o", tmp_path / "ref", *common).exit_code == 0
    res = run_cli("convert", tmp_path / "in", "-o", f"s3://{bucket}/pq", *common)
    assert res.exit_code == 0, res.stderr
    got = _download(client, bucket, "pq", tmp_path / "got")
    same_dataset(tmp_path / "ref", got)
    assert run_cli("verify", got, "--deep").exit_code == 0
    assert {"train-000003.parquet", "val-000000.parquet", "README.md"} <= set(_keys(client, bucket, "pq"))
    res = run_cli("convert", tmp_path / "in", "-o", f"s3://{bucket}/pq", *common[:2], "-q", "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert sorted(k for k in _keys(client, bucket, "pq") if k.endswith(".parquet")) == ["train-000000.parquet"]


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_convert_lance_to_s3_equals_local(store, tmp_path):
    """A format that writes a folder of its own (``{split}.lance/``, declared as one) goes up whole,
    its table's files included, and --overwrite takes what it made away."""
    pytest.importorskip("lance", reason="--to lance needs pylance")
    client, _ = store
    bucket = _bucket(client, "out-lance")
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(300, seed=3))
    common = ["--to", "lance", "--text-field", "text", "--shard-samples", "70", "--split", "train=0.8,val=0.2", "-q",
              "--workers", "2"]
    assert run_cli("convert", tmp_path / "in", "-o", tmp_path / "ref", *common).exit_code == 0
    res = run_cli("convert", tmp_path / "in", "-o", f"s3://{bucket}/ln", *common)
    assert res.exit_code == 0, res.stderr
    got = _download(client, bucket, "ln", tmp_path / "got", folders=True)
    same_dataset(tmp_path / "ref", got)
    assert run_cli("verify", got, "--deep").exit_code == 0
    keys = set(_keys(client, bucket, "ln"))
    assert {"train.lance/data/train-000003.lance", "val.lance/_versions/18446744073709551614.manifest"} <= keys
    res = run_cli("convert", tmp_path / "in", "-o", f"s3://{bucket}/ln", *common[:2], "-q", "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert not [k for k in _keys(client, bucket, "ln") if k.startswith("val.lance/")], "the val split's table is gone"


@pytest.mark.parametrize("fmt, options, files", [
    ("hdf5", [], set()),
    ("memmap", ["--branches", "Jet_*,NJet", "--max-len", "4", "--split", "train=0.8,val=0.2"],
     {"train.memmap.json", "val.values.bin", "val.NJet.bin"}),
])
def test_convert_events_to_s3_equals_local(store, tmp_path, fmt, options, files):
    client, _ = store
    bucket = _bucket(client, f"out-{fmt}")
    common = ["--to", fmt, *options, "-q", "--workers", "1"]
    src = root_data() / "uproot-HZZ.root"
    assert run_cli("convert", src, "-o", tmp_path / "ref", *common).exit_code == 0
    res = run_cli("convert", src, "-o", f"s3://{bucket}/events/hzz", *common)
    assert res.exit_code == 0, res.stderr
    got = _download(client, bucket, "events/hzz", tmp_path / "got")
    same_dataset(tmp_path / "ref", got)
    assert {p.name for p in got.iterdir()} >= files
    assert run_cli("verify", got, *(["--deep"] if files else [])).exit_code == 0


@pytest.mark.parametrize("point", [
    "gather:train:0",  # while writing shards, before any upload
    "uploaded",        # one file up, the others not
    "upload-part",     # inside a multipart upload: one part up
    "published",       # the manifest is up, the run record not yet removed
])
def test_killed_run_resumes_against_the_bucket(store, corpus, bpe_tokenizer, tmp_path, point):
    client, faults = store
    bucket = _bucket(client, "out-kill")
    prefix = f"k-{point.replace(':', '-')}"
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer)).exit_code == 0
    args = _pack(corpus, f"s3://{bucket}/{prefix}", bpe_tokenizer)
    killed = run_subprocess(*args, env={**os.environ, "SHARDSMITH_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    _settled(faults)
    before = _keys(client, bucket, prefix)
    assert ("manifest.json" in before) == (point == "published"), "the manifest goes up last"
    assert ".shardsmith-run.json" in before, "the prefix says which command is filling it"
    parts_up = {(name, n) for name, n in _puts(faults) if n}
    start = len(faults.requests)
    res = run_subprocess(*args)
    assert res.returncode == 0, res.stderr
    again = _puts(faults, start)
    done = {k for k in before if k not in (".shardsmith-run.json", "manifest.json")}
    assert not {name for name, _ in again} & done, "objects already up are not uploaded again"
    if point == "upload-part":
        assert parts_up, "killed inside a multipart upload"
        assert not parts_up & set(again), "the parts already up are reused"
    if point == "published":
        # (its record is taken from the dead run, conditionally, and removed: no other object is put)
        assert [put for put in again if put[0] != ".shardsmith-run.json"] == [], "a finished dataset is not uploaded again"
    after = _keys(client, bucket, prefix)
    assert ".shardsmith-run.json" not in after
    same_dataset(tmp_path / "ref", _download(client, bucket, prefix, tmp_path / "got"))
    assert not list(client.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", []))


def test_overwrite_and_the_checks_of_a_folder(store, corpus, bpe_tokenizer, tmp_path):
    client, _ = store
    bucket = _bucket(client, "out-checks")
    url = f"s3://{bucket}/ds"
    assert run_cli(*_pack(corpus, url, bpe_tokenizer)).exit_code == 0
    first = _keys(client, bucket, "ds")
    # the same command again: complete (the manifest records the run), nothing uploaded or removed
    res = run_cli(*[a for a in _pack(corpus, url, bpe_tokenizer) if a != "-q"])
    assert res.exit_code == 0 and "already complete (this same command finished it" in res.stderr, res.stderr
    assert _keys(client, bucket, "ds") == first
    res = run_cli(*_pack(corpus, url, bpe_tokenizer, "--seed", "1"))
    assert res.exit_code == 2 and "finished dataset" in res.stderr and "--overwrite" in res.stderr
    assert "made with other options: no --seed (now 1);" in res.stderr, res.stderr  # what differs, named
    assert len(res.stderr.strip().splitlines()) == 1 and _keys(client, bucket, "ds") == first
    # --overwrite: another dataset in its place (shards of the old one that the new one lacks are gone)
    res = run_cli(*_pack(corpus, url, bpe_tokenizer, "--seed", "1", "--shard-tokens", "200K", "--overwrite"))
    assert res.exit_code == 0, res.stderr
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer, "--seed", "1", "--shard-tokens", "200K")
                   ).exit_code == 0
    same_dataset(tmp_path / "ref", _download(client, bucket, "ds", tmp_path / "got"))
    # an object shardsmith did not write: refused, with or without --overwrite, and nothing is deleted
    client.put_object(Bucket=bucket, Key="ds/notes/readme.txt", Body=b"mine")
    kept = _keys(client, bucket, "ds")
    for extra in ((), ("--overwrite",)):
        res = run_cli(*_pack(corpus, url, bpe_tokenizer, *extra))
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert _keys(client, bucket, "ds") == kept
    assert "notes/readme.txt" in run_cli(*_pack(corpus, url, bpe_tokenizer, "--overwrite")).stderr


def test_a_staged_dataset_killed_before_publishing_is_published_as_made_or_made_again(store, corpus, bpe_tokenizer,
                                                                                    tmp_path):
    """Killed once the staged dataset is whole (its manifest written locally), the same command
    publishes it as it is; a staged file changed meanwhile makes it again (never the changed bytes)."""
    client, faults = store
    bucket = _bucket(client, "out-staged")
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer)).exit_code == 0
    for name, tamper in (("as-made", False), ("changed", True)):
        staging = tmp_path / f"staging-{name}"
        args = [*_pack(corpus, f"s3://{bucket}/{name}", bpe_tokenizer), "--staging", staging]
        killed = run_subprocess(*args, env={**os.environ, "SHARDSMITH_CRASH_AT": "committed"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert (staging / "manifest.json").is_file()
        if tamper:
            with open(staging / "train-000000.bin", "r+b") as fh:
                fh.write(b"\xff\xff")
        _settled(faults)
        before = set(_keys(client, bucket, name)) - {".shardsmith-run.json"}
        start = len(faults.requests)
        res = run_subprocess(*args)
        assert res.returncode == 0, res.stderr
        same_dataset(tmp_path / "ref", _download(client, bucket, name, tmp_path / f"got-{name}"))
        if not tamper:
            assert not {n for n, _ in _puts(faults, start)} & before, "objects already up are not uploaded again"


def test_another_commands_unfinished_output_is_refused(store, corpus, bpe_tokenizer, tmp_path):
    client, _ = store
    bucket = _bucket(client, "out-other")
    url = f"s3://{bucket}/half"
    args = _pack(corpus, url, bpe_tokenizer)
    killed = run_subprocess(*args, env={**os.environ, "SHARDSMITH_CRASH_AT": "uploaded"})
    assert killed.returncode == -signal.SIGKILL
    res = run_cli(*_pack(corpus, url, bpe_tokenizer, "--seed", "7"))
    assert res.exit_code == 2 and "unfinished output of a different command" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert run_cli(*args).exit_code == 0  # the same command takes it over
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer)).exit_code == 0
    same_dataset(tmp_path / "ref", _download(client, bucket, "half", tmp_path / "got"))


def test_the_run_record_is_put_once(store):
    """Two runs claiming one empty prefix at once: the conditional put lets one win (moto honours
    ``If-None-Match: *``)."""
    from shardsmith.storage import retry
    from shardsmith.storage.stores import open_store

    client, _ = store
    bucket = _bucket(client, "out-race")
    s = open_store(f"s3://{bucket}/p", policy=retry.Policy(retries=0))
    assert s.put_new(".shardsmith-run.json", b"{}") is True
    assert s.put_new(".shardsmith-run.json", b"{}") is False


def test_through_faults_the_bytes_are_the_same(s3, s3_env, monkeypatch, corpus, bpe_tokenizer, tmp_path):  # noqa: F811
    _small_parts(monkeypatch, tmp_path)
    bucket = _bucket(s3, "out-faults")
    faults = Faults(slowdown=0.25, seed=5)
    with fault_proxy(s3_env["AWS_ENDPOINT_URL"], faults) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        res = run_cli(*_pack(corpus, f"s3://{bucket}/flaky", bpe_tokenizer, "--retries", "8"))
    assert res.exit_code == 0, res.stderr
    assert faults.count("503") > 3
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer)).exit_code == 0
    same_dataset(tmp_path / "ref", _download(s3, bucket, "flaky", tmp_path / "got"))
    assert not s3.list_multipart_uploads(Bucket=bucket, Prefix="flaky/").get("Uploads"), "stale uploads aborted"


@pytest.mark.parametrize("where, says", [
    ("s3://no-such-bucket-here/x", "no such bucket"),
    ("s3://key:secret@out-errors/x", "carry no credentials"),
])
def test_storage_errors_are_one_line(store, corpus, bpe_tokenizer, where, says):
    client, _ = store
    _bucket(client, "out-errors")
    res = run_cli(*_pack(corpus, where, bpe_tokenizer))
    assert res.exit_code == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "secret" not in res.stderr and KEYS["AWS_SECRET_ACCESS_KEY"] not in res.stderr


def test_unreachable_endpoint_and_stages(store, corpus, bpe_tokenizer, monkeypatch):
    client, _ = store
    _bucket(client, "out-stage")
    res = run_cli(*_pack(corpus, "s3://out-stage/x", bpe_tokenizer, "--stage", "scatter"))  # tests/test_s3_stages_out.py
    assert res.exit_code == 0, res.stderr
    res = run_cli(*_pack(corpus, "s3://out-stage/x", bpe_tokenizer))  # a whole run into the stages' unfinished work
    assert res.exit_code == 2 and "--stage finalize" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    res = run_cli(*_pack(corpus, "s3://out-stage/y", bpe_tokenizer, "--retries", "1"))
    assert res.exit_code == 2 and "after 2 attempts" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_missing_s3fs_names_the_extra(store, corpus, bpe_tokenizer, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if not installed: the import fails
    res = run_cli(*_pack(corpus, "s3://out-errors/x", bpe_tokenizer))
    assert res.exit_code == 2 and install_hint("s3") in res.stderr, res.stderr


def test_manifest_of_a_bucket_run_names_no_credentials(store, corpus, bpe_tokenizer, tmp_path):
    client, _ = store
    bucket = _bucket(client, "out-manifest")
    assert run_cli(*_pack(corpus, f"s3://{bucket}/m", bpe_tokenizer)).exit_code == 0
    body = client.get_object(Bucket=bucket, Key="m/manifest.json")["Body"].read()
    assert KEYS["AWS_SECRET_ACCESS_KEY"].encode() not in body and KEYS["AWS_ACCESS_KEY_ID"].encode() not in body
    assert orjson.loads(body)["splits"]["train"]["shards"]


def test_a_failed_run_leaves_nothing_that_refuses_the_next(store, tmp_path):
    client, _ = store
    bucket = _bucket(client, "out-failed")
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(300, seed=1))
    with open(tmp_path / "in" / "a.jsonl", "a") as fh:
        fh.write("{not json\n")
    common = ["--to", "webdataset", "--text-field", "text", "-q", "--workers", "1"]
    res = run_cli("convert", tmp_path / "in", "-o", f"s3://{bucket}/f", *common)
    assert res.exit_code == 1 and "pass --on-error skip" in res.stderr
    assert _keys(client, bucket, "f") == {}, "a failed run into an empty prefix removes what it put there"
    assert not list((tmp_path / "cache").rglob("*.json")), "and its staging folder"
    res = run_cli("convert", tmp_path / "in", "-o", f"s3://{bucket}/f", *common, "--on-error", "skip", "--seed", "3")
    assert res.exit_code == 0, res.stderr


def test_a_recipe_writes_to_the_bucket(store, tmp_path):
    client, _ = store
    bucket = _bucket(client, "out-recipe")
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(200, seed=4))
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'command = "convert"\ninputs = ["{tmp_path / "in"}"]\nout = "s3://{bucket}/r"\n'
                      f'[options]\nto = "webdataset"\ntext-field = "text"\nquiet = true\n')
    res = run_cli("run", recipe)
    assert res.exit_code == 0, res.stderr
    assert "manifest.json" in _keys(client, bucket, "r")


def test_staging_folder_option(store, corpus, bpe_tokenizer, tmp_path):
    client, _ = store
    bucket = _bucket(client, "out-staging")
    staging = tmp_path / "stage" / "here"
    staging.mkdir(parents=True)
    (staging / "mine.txt").write_text("not shardsmith's")
    res = run_cli(*_pack(corpus, staging.parent / "x", bpe_tokenizer, "--staging", staging))
    assert res.exit_code == 2 and "object storage" in res.stderr  # a local -o takes no staging folder
    res = run_cli(*_pack(corpus, f"s3://{bucket}/s", bpe_tokenizer, "--staging", staging))
    assert res.exit_code == 2 and "mine.txt" in res.stderr, res.stderr  # the folder's own checks hold
    (staging / "mine.txt").unlink()
    res = run_cli(*_pack(corpus, f"s3://{bucket}/s", bpe_tokenizer, "--staging", staging))
    assert res.exit_code == 0, res.stderr
    assert not staging.exists() and "manifest.json" in _keys(client, bucket, "s")
    res = run_cli(*_pack(corpus, f"s3://{bucket}/t", bpe_tokenizer, "--part-size", "1MB"))
    assert res.exit_code == 2 and "5MiB" in res.stderr


def test_a_finished_dataset_with_another_runs_record_is_kept(store, corpus, bpe_tokenizer):
    """Killed after its manifest went up: another command is refused and deletes nothing."""
    client, _ = store
    bucket = _bucket(client, "out-record")
    args = _pack(corpus, f"s3://{bucket}/done", bpe_tokenizer)
    killed = run_subprocess(*args, env={**os.environ, "SHARDSMITH_CRASH_AT": "published"})
    assert killed.returncode == -signal.SIGKILL
    kept = _keys(client, bucket, "done")
    res = run_cli(*_pack(corpus, f"s3://{bucket}/done", bpe_tokenizer, "--seed", "9"))
    assert res.exit_code == 2 and "finished dataset" in res.stderr, res.stderr
    assert _keys(client, bucket, "done") == kept
    res = run_cli(*args)  # the run itself: complete, its record removed
    assert res.exit_code == 0, res.stderr
    assert ".shardsmith-run.json" not in _keys(client, bucket, "done")


def test_an_object_that_cannot_be_uploaded_keeps_the_run(s3, s3_env, monkeypatch, corpus, bpe_tokenizer,  # noqa: F811
                                                         tmp_path):
    """An upload that fails after its retries stops the run in one line (exit 1) and keeps what is
    made and uploaded: the same command, once the store answers, uploads only the rest."""
    _small_parts(monkeypatch, tmp_path)
    bucket = _bucket(s3, "out-doomed")
    args = _pack(corpus, f"s3://{bucket}/d", bpe_tokenizer, "--retries", "2")
    faults = Faults(doomed=("val-000000.idx",))
    with fault_proxy(s3_env["AWS_ENDPOINT_URL"], faults) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        res = run_cli(*args)
    assert res.exit_code == 1 and "run the same command again" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    before = _keys(s3, bucket, "d")
    assert "manifest.json" not in before and "train-000000.bin" in before
    faults = Faults()
    with fault_proxy(s3_env["AWS_ENDPOINT_URL"], faults) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        assert run_cli(*args).exit_code == 0
    # (the proxy passes a doomed request on before it answers 503: the object may be there already)
    # (the run record is put too: it is the run's lease on the prefix, rewritten before the manifest)
    assert "manifest.json" in {name for name, _ in _puts(faults)} - {".shardsmith-run.json"} <= {
        "val-000000.idx", "manifest.json"}
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer)).exit_code == 0
    same_dataset(tmp_path / "ref", _download(s3, bucket, "d", tmp_path / "got"))


def test_ctrl_c_during_an_upload_ends_soon_and_resumes(store, corpus, bpe_tokenizer, tmp_path):
    import subprocess
    import sys

    client, _ = store
    bucket = _bucket(client, "out-sigint")
    args = [str(a) for a in _pack(corpus, f"s3://{bucket}/i", bpe_tokenizer)]
    held = Stall(tmp_path, "upload-part")  # never released: an upload held for ten minutes
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", *args], env={**os.environ, **held.env},
                            stderr=subprocess.PIPE, text=True)
    held.reached(proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) == 130, "Ctrl-C ends the run, uploads under way or not"
    assert "run the same command again" in proc.stderr.read()
    assert "manifest.json" not in _keys(client, bucket, "i")
    res = run_subprocess(*args)
    assert res.returncode == 0, res.stderr
    assert run_cli(*_pack(corpus, tmp_path / "ref", bpe_tokenizer)).exit_code == 0
    same_dataset(tmp_path / "ref", _download(client, bucket, "i", tmp_path / "got"))


def test_a_finished_prefix_whose_objects_changed_is_not_complete(store, corpus, bpe_tokenizer):
    """The same command into a prefix it finished is complete only while every object the manifest
    lists is there with its size (issue 32): one deleted, or rewritten shorter, is named, and nothing
    is uploaded or removed."""
    client, _ = store
    bucket = _bucket(client, "out-changed")
    url = f"s3://{bucket}/ds"
    assert run_cli(*_pack(corpus, url, bpe_tokenizer)).exit_code == 0
    m = orjson.loads(client.get_object(Bucket=bucket, Key="ds/manifest.json")["Body"].read())
    shard, tok = m["splits"]["val"]["shards"][0]["path"], "tokenizer.json"
    client.delete_object(Bucket=bucket, Key=f"ds/{shard}")
    client.put_object(Bucket=bucket, Key=f"ds/{tok}", Body=b"{}")
    kept = _keys(client, bucket, "ds")
    res = run_cli(*_pack(corpus, url, bpe_tokenizer))
    assert res.exit_code == 2 and "already complete" not in res.stderr, res.stderr
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and "changed since" in line and f"{shard} is missing" in line, line
    assert f"{tok} is 2 bytes, the manifest says" in line and "--overwrite" in line
    assert _keys(client, bucket, "ds") == kept
    assert run_cli(*_pack(corpus, url, bpe_tokenizer, "--overwrite")).exit_code == 0
    assert "already complete" in run_cli(*[a for a in _pack(corpus, url, bpe_tokenizer) if a != "-q"]).stderr


# -- a format written as folders --------------------------------------------------------------------------

@pytest.fixture
def folders_format() -> Iterator[None]:
    with registered():
        yield


def _rows(folder: Path) -> Path:
    """Rows in two JSONL files: five shards of 20 at ``--shard-samples 20``."""
    docs = make_docs(100, seed=11, max_words=12)
    write_jsonl(folder / "a.jsonl", docs[:60])
    write_jsonl(folder / "b.jsonl", docs[60:])
    return folder


def _folders(rows: Path, out: str | Path, *extra: str, shards: int = 20) -> list[str]:
    return ["convert", str(rows), "-o", str(out), "--to", "folders", "--shard-samples", str(shards), "-q", *extra]


def _ok(args: list[str]) -> None:
    res = run_cli(*args)
    assert res.exit_code == 0, res.stderr


def test_a_format_written_as_folders_is_published_resumed_and_overwritten_whole(store, folders_format, tmp_path):
    """A format that writes each shard as a folder (``tests/folder_format.py``): a run killed before
    its manifest leaves its folders in the staging folder, which the same command takes over; every
    file of every folder goes up, ``verify`` reads them back, ``--overwrite`` removes the folders'
    objects it no longer makes (issue 45, item 3)."""
    client, _ = store
    rows = _rows(tmp_path / "rows")
    bucket = _bucket(client, "out-folders")
    _ok(_folders(rows, tmp_path / "ref"))
    run_killed(_folders(rows, f"s3://{bucket}/ds"), "manifest")
    _ok(_folders(rows, f"s3://{bucket}/ds"))
    keys = set(_keys(client, bucket, "ds"))
    assert {f"train-{i:06d}.dir/{f}" for i in range(5) for f in (SAMPLES, LENGTHS)} <= keys
    got = _download(client, bucket, "ds", tmp_path / "got", folders=True)
    assert tree_digest(got) == tree_digest(tmp_path / "ref")
    res = run_cli("verify", f"s3://{bucket}/ds", "--deep")
    assert res.exit_code == 0 and "OK: 10 files" in res.output, res.output
    _ok(_folders(rows, f"s3://{bucket}/ds", "--overwrite", shards=50))
    assert sorted(k for k in _keys(client, bucket, "ds") if ".dir/" in k) == [
        f"train-{i:06d}.dir/{f}" for i in range(2) for f in (LENGTHS, SAMPLES)]
    assert not list((tmp_path / "cache").rglob("*.dir")), "the staging folder goes once the dataset is up"
