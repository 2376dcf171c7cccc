"""Inputs from Google Cloud Storage (issue 15), against a real GCS server: gcp-storage-emulator (the
JSON API, pure Python) in a process of its own on a free port, which gcsfs reaches through
``STORAGE_EMULATOR_HOST``.

Every run from ``gs://`` is compared with the same command on a local copy laid out the same way: the
shards are byte-identical, and the manifests equal but for ``created``, ``command`` and the input root
URL. No client library is mocked.

gcsfs's default filesystem in its 2026 releases (``ExtendedGcsFileSystem``) first asks the Storage
Control API, over gRPC, what kind of bucket it reads (zonal, hierarchical); the emulator speaks only
the JSON API, so gcsfs would retry that question for a minute per bucket and log each failure. The
tests therefore use gcsfs's own switch, ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (read when gcsfs
is imported, so it is set before), which selects the JSON-API filesystem that the extended one falls
back to for an ordinary bucket.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from conftest import free_port, jpeg_folder, make_docs, run_cli, same_dataset, write_jsonl

from shardsmith.errors import install_hint

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
gcsfs = pytest.importorskip("gcsfs", reason="GCS inputs need gcsfs (pip install 'shardsmith[gcs]')")
pytest.importorskip("gcp_storage_emulator", reason="the GCS tests need gcp-storage-emulator (the dev extra)")




# the emulator's command, its server answering each connection in a thread of its own: its plain
# HTTPServer serves one connection at a time, so one a client leaves idle would stall every other (the
# likely cause, not proven, of two hung runs of this module with its one-connection server)
_SERVE = """
import sys
from http import server
server.HTTPServer = server.ThreadingHTTPServer
from gcp_storage_emulator.__main__ import main
main(sys.argv[1:])
"""


@pytest.fixture(scope="module")
def gs_env(tmp_path_factory) -> dict[str, str]:
    """A GCS emulator for the module (a process of its own, objects in memory; what it logs goes to a
    file, never into a run's stderr); the variables that point gcsfs at it and keep google-auth's search
    for credentials short (it finds none, so gcsfs goes anonymous)."""
    if gcsfs.GCSFileSystem.__name__ != "GCSFileSystem":
        pytest.skip("gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set: its extended "
                    "filesystem needs the Storage Control gRPC API, which the emulator lacks")
    port = free_port()
    log = tmp_path_factory.mktemp("gcs-emulator") / "emulator.log"
    with open(log, "wb") as sink:
        server = subprocess.Popen([sys.executable, "-c", _SERVE, "start", "--host", "127.0.0.1", "--port", str(port),
                                   "--in-memory", "--quiet"], stdout=sink, stderr=sink)
    try:
        _wait_for(f"http://127.0.0.1:{port}/", server, log)
        yield {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
               # google-auth's probe for a metadata server: the emulator answers at once, not as one
               "NO_GCE_CHECK": "true", "GCE_METADATA_IP": f"127.0.0.1:{port}"}
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_for(url: str, server: subprocess.Popen, log: Path) -> None:
    """Until the emulator answers its health check (skip if it exits or stays silent for 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.skip(f"the GCS emulator exited: {log.read_text(errors='replace')[-500:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    pytest.skip("the GCS emulator did not answer within 60 s")


@pytest.fixture
def gs(gs_env, monkeypatch):
    """A gcsfs filesystem on the emulator, with the variables set for in-process runs of the CLI."""
    for k, v in gs_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True, use_listings_cache=False)


def _upload(fs, bucket: str, local: Path, prefix: str) -> None:
    """Every file below ``local`` to ``gs://bucket/prefix/REL`` (the bucket made once)."""
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for p in sorted(local.rglob("*")):
        if p.is_file():
            fs.pipe_file(f"{bucket}/{prefix}/{p.relative_to(local).as_posix()}", p.read_bytes())




def test_convert_jsonl_from_gs_equals_local(gs, tmp_path):
    local = tmp_path / "corpus"
    write_jsonl(local / "a.jsonl", make_docs(120, seed=1))
    write_jsonl(local / "sub" / "b.jsonl", make_docs(80, seed=2))
    _upload(gs, "shardsmith-jsonl", local, "data")
    gs.pipe_file("shardsmith-jsonl/data/notes.txt", b"not an input")
    common = ["--to", "webdataset", "--workers", "2", "--seed", "7", "--split", "train=0.8,val=0.2", "-q"]
    ref = run_cli("convert", local, "-o", tmp_path / "ref", *common)
    assert ref.exit_code == 0, ref.stderr
    got = run_cli("convert", "gs://shardsmith-jsonl/data/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    assert got.stderr == "", got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    manifest = orjson.loads((tmp_path / "got" / "manifest.json").read_bytes())
    assert manifest["source"]["inputs"] == ["a.jsonl", "sub/b.jsonl"]
    assert manifest["source"]["input_root"] == "gs://shardsmith-jsonl/data/"
    assert not (tmp_path / ".got.shardsmith-work").exists(), "the staged inputs go with the scratch folder"
    # one object: its identity is its name, as for a local file
    one = run_cli("convert", "gs://shardsmith-jsonl/data/a.jsonl", "-o", tmp_path / "one", *common)
    ref_one = run_cli("convert", local / "a.jsonl", "-o", tmp_path / "ref-one", *common)
    assert one.exit_code == 0 and ref_one.exit_code == 0, one.stderr + ref_one.stderr
    same_dataset(tmp_path / "ref-one", tmp_path / "one")


def test_image_folder_from_gs_keeps_classes(gs, tmp_path):
    local = jpeg_folder(tmp_path / "images", classes=3, per_class=4)
    _upload(gs, "shardsmith-images", local, "images")
    common = ["--to", "webdataset", "--workers", "1", "-q"]
    assert run_cli("convert", local, "-o", tmp_path / "ref", *common).exit_code == 0
    got = run_cli("convert", "gs://shardsmith-images/images/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    assert orjson.loads((tmp_path / "got" / "manifest.json").read_bytes())["classes"] == ["c0", "c1", "c2"]


def test_pack_tokens_from_gs_prefix_and_glob_equals_local(gs, tmp_path, bpe_tokenizer):
    local = tmp_path / "text"
    write_jsonl(local / "a.jsonl", make_docs(150, seed=3))
    write_jsonl(local / "b.jsonl", make_docs(90, seed=4))
    _upload(gs, "shardsmith-text", local, "data")
    common = ["--tokenizer", bpe_tokenizer, "--workers", "2", "--shard-tokens", "4K", "-q"]
    ref = run_cli("pack-tokens", local, "-o", tmp_path / "ref", *common)
    assert ref.exit_code == 0, ref.stderr
    got = run_cli("pack-tokens", "gs://shardsmith-text/data/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    same_dataset(tmp_path / "ref", tmp_path / "got")
    globbed = run_cli("pack-tokens", "gs://shardsmith-text/data/*.jsonl", "-o", tmp_path / "glob", *common)
    ref_files = run_cli("pack-tokens", local / "a.jsonl", local / "b.jsonl", "-o", tmp_path / "ref-files", *common)
    assert globbed.exit_code == 0 and ref_files.exit_code == 0, globbed.stderr + ref_files.stderr
    same_dataset(tmp_path / "ref-files", tmp_path / "glob")


@pytest.mark.parametrize("url, says", [
    ("gs://shardsmith-errors/nothing-here.jsonl", "gs://shardsmith-errors/nothing-here.jsonl: no such object"),
    ("gs://shardsmith-errors/data/*.parquet", "gs://shardsmith-errors/data/*.parquet: no object matches"),
    ("gs://someone:hunter2@shardsmith-errors/data/", "gs://shardsmith-errors/data/: gs:// URLs carry no "
                                                     "credentials; set GOOGLE_APPLICATION_CREDENTIALS instead"),
])
def test_storage_errors_are_one_line(gs, tmp_path, url, says):
    if not gs.exists("shardsmith-errors/data/a.jsonl"):
        _upload(gs, "shardsmith-errors", write_jsonl(tmp_path / "e" / "a.jsonl", ["x"]).parent, "data")
    res = run_cli("convert", url, "-o", tmp_path / "out", "--to", "webdataset", "-q")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert "hunter2" not in res.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.shardsmith-work").exists()


_BLOCK_GCSFS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "gcsfs":
            raise ModuleNotFoundError("No module named 'gcsfs'", name="gcsfs")
sys.meta_path.insert(0, Block())
from shardsmith.program import main
sys.argv = ["shardsmith"] + sys.argv[1:]
main()
"""


def test_missing_gcsfs_names_the_extra(gs_env, tmp_path):
    res = subprocess.run([sys.executable, "-c", _BLOCK_GCSFS, "convert", "gs://bucket/data/", "-o",
                          str(tmp_path / "out"), "--to", "webdataset"], capture_output=True, text=True,
                         env={**os.environ, **gs_env}, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == ("shardsmith: error: gs://bucket/data/: reading gs:// needs gcsfs: "
                                  f"{install_hint('gcs')}"), res.stderr


def test_verify_and_inspect_a_dataset_on_gs(gs, tmp_path):
    """``verify`` (and ``--deep``) and ``inspect`` of a dataset at a gs:// URL say what they say of the
    folder it was uploaded from (``tests/test_verify_urls.py`` for s3://, http:// and root://)."""
    write_jsonl(tmp_path / "docs" / "a.jsonl", make_docs(90, seed=3))
    folder = tmp_path / "wds"
    res = run_cli("convert", tmp_path / "docs", "-o", folder, "--to", "webdataset", "--shard-samples", "30", "-q")
    assert res.exit_code == 0, res.stderr
    _upload(gs, "shardsmith-datasets", folder, "wds")
    url = "gs://shardsmith-datasets/wds"
    for deep in ((), ("--deep",)):
        got, want = run_cli("verify", url, *deep), run_cli("verify", folder, *deep)
        assert got.exit_code == 0 and got.output.startswith(f"{url}: OK: "), got.output + got.stderr
        assert got.output.split(": OK: ")[1].split(" in ")[0] == want.output.split(": OK: ")[1].split(" in ")[0]
    info, local = (orjson.loads(run_cli("inspect", where, "--json").output) for where in (url, folder))
    assert info.pop("path") == url and local.pop("path") == str(folder) and info == local
    gs.pipe_file("shardsmith-datasets/wds/train-000001.tar", (folder / "train-000001.tar").read_bytes()[:-512])
    res = run_cli("verify", url)
    assert res.exit_code == 1 and "FAIL train-000001.tar: " in res.output and "bytes, the manifest says" in res.output
