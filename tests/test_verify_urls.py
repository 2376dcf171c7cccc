"""``verify`` and ``inspect`` of a dataset at a URL (issue 27), against a real S3 server (moto in server
mode) and a real web server: read as the streaming loader reads it, they say what they say of the same
dataset in a folder. A changed, truncated or missing object is one line naming the file; a URL the
loader does not read is one line and exit 2. No client library is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import root_data, run_cli

pytest.importorskip("s3fs", reason="verify of s3:// needs s3fs (pip install 'shardsmith[s3]')")
boto3 = pytest.importorskip("boto3", reason="the S3 tests make their buckets with boto3 (the dev extra)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server mode (moto[server])")

from test_s3_inputs import s3, s3_env  # noqa: E402,F401  (fixtures)
from test_stream_loader import BUCKET, bucket, local, upload  # noqa: E402,F401  (fixtures)
from test_xrootd_inputs import server  # noqa: E402,F401  (a fixture: skips where XRootD is not installed)

STREAMED = ["webdataset", "tokens", "hdf5", "event-tar"]  # the formats the loader streams


@pytest.fixture(scope="module")
def memmap_url(s3_env, bucket, tmp_path_factory) -> tuple[str, Path]:  # noqa: F811
    """A memmap dataset written with ``-o s3://`` (and the same run into a folder): (URL, folder)."""
    tmp = tmp_path_factory.mktemp("memmap")
    args = ["convert", root_data() / "uproot-HZZ.root", "--to", "memmap", "--branches", "Jet_*,NJet",
            "--max-len", "4", "--split", "train=0.8,val=0.2", "-q"]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3_env.items():
            mp.setenv(k, v)
        mp.setenv("XDG_CACHE_HOME", str(tmp / "xdg"))
        res = run_cli(*args, "-o", f"s3://{BUCKET}/memmap")
        assert res.exit_code == 0, res.stderr
    assert run_cli(*args, "-o", tmp / "memmap").exit_code == 0
    return f"s3://{BUCKET}/memmap", tmp / "memmap"


def _summary(output: str) -> str:
    """verify's last line without its place and timing: ``OK: N files, M samples, SIZE checked``."""
    line = output.strip().splitlines()[-1]
    return line.split(": ", 1)[1].rsplit(" in ", 1)[0]


@pytest.mark.parametrize("name", [*STREAMED, "memmap"])
def test_verify_a_url_says_what_it_says_of_the_folder(s3, bucket, local, memmap_url, name):  # noqa: F811
    url, folder = memmap_url if name == "memmap" else (bucket[name], local[name])
    got, want = run_cli("verify", url), run_cli("verify", folder)
    assert got.exit_code == 0 and want.exit_code == 0, got.output + got.stderr
    assert got.output.startswith(f"{url}: OK: "), got.output
    assert _summary(got.output) == _summary(want.output)


@pytest.mark.parametrize("name", STREAMED)
def test_verify_deep_a_url(s3, bucket, local, name):  # noqa: F811
    got, want = run_cli("verify", bucket[name], "--deep"), run_cli("verify", local[name], "--deep")
    assert got.exit_code == 0, got.output + got.stderr
    assert _summary(got.output) == _summary(want.output) and "(deep)" in got.output


def test_verify_deep_of_a_memmap_url_says_it_needs_a_folder(s3, memmap_url):  # noqa: F811
    res = run_cli("verify", memmap_url[0], "--deep")
    fails = [line for line in res.output.splitlines() if line.startswith("FAIL")]
    assert res.exit_code == 1 and len(fails) == 2, res.output  # one line per split
    assert all("memmap datasets are mapped from a local folder" in line for line in fails)


def _damaged(s3, local, prefix: str) -> tuple[str, str, bytes]:  # noqa: F811
    """A fresh copy of the webdataset at ``s3://BUCKET/PREFIX``: (its URL, a shard's name, its bytes)."""
    upload(s3, local["webdataset"], prefix)
    rel = json.loads((local["webdataset"] / "manifest.json").read_bytes())["splits"]["train"]["shards"][1]["path"]
    return f"s3://{BUCKET}/{prefix}", rel, (local["webdataset"] / rel).read_bytes()


def _fails(res) -> list[str]:
    assert res.exit_code == 1, res.output + res.stderr
    assert not res.stderr, res.stderr
    return [line for line in res.output.splitlines() if line.startswith("FAIL")]


def test_a_changed_object_is_one_line_naming_it(s3, bucket, local):  # noqa: F811
    url, rel, data = _damaged(s3, local, "changed")
    flipped = bytearray(data)
    flipped[700] ^= 1
    s3.put_object(Bucket=BUCKET, Key=f"changed/{rel}", Body=bytes(flipped))
    for deep in ((), ("--deep",)):
        fails = _fails(run_cli("verify", url, *deep))
        assert len(fails) == 1 and fails[0].startswith(f"FAIL {rel}: sha256 "), fails


def test_a_truncated_or_missing_object_is_one_line_naming_it(s3, bucket, local):  # noqa: F811
    url, rel, data = _damaged(s3, local, "truncated")
    s3.put_object(Bucket=BUCKET, Key=f"truncated/{rel}", Body=data[:-512])
    fails = _fails(run_cli("verify", url))
    assert fails == [f"FAIL {rel}: {len(data) - 512} bytes, the manifest says {len(data)}"]
    s3.delete_object(Bucket=BUCKET, Key=f"truncated/{rel}")
    fails = _fails(run_cli("verify", url))
    assert fails == [f"FAIL {rel}: missing"]


def test_no_dataset_at_the_url_is_one_line(s3, bucket):  # noqa: F811
    res = run_cli("verify", f"s3://{BUCKET}/no-such-dataset")
    assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1
    assert "no manifest.json" in res.output
    res = run_cli("inspect", f"s3://{BUCKET}/no-such-dataset")
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1 and "no manifest.json" in res.stderr


@pytest.mark.parametrize("url, says", [
    ("nope://bucket/ds", "nope://bucket/ds: unknown URL scheme nope://"),
    ("az://container/ds", "az://container/ds: az:// datasets are not supported yet"),
    ("file:///tmp/ds", "file:///tmp/ds: give the local path instead of a file:// URL"),
    ("s3://key:hunter2@bucket/ds", "s3://bucket/ds: s3:// URLs carry no credentials"),
])
def test_a_url_the_loader_does_not_read_is_one_line_and_exit_2(url, says):
    for command in ("verify", "inspect"):
        res = run_cli(command, url)
        assert res.exit_code == 2, (command, res.output, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "hunter2" not in res.stderr, (command, res.stderr)


@pytest.mark.parametrize("name", [*STREAMED, "memmap"])
def test_inspect_a_url_shows_the_summary_of_the_folder(s3, bucket, local, memmap_url, name):  # noqa: F811
    url, folder = memmap_url if name == "memmap" else (bucket[name], local[name])
    got, want = run_cli("inspect", url, "--json", "--samples", "2"), run_cli("inspect", folder, "--json",
                                                                           "--samples", "2")
    assert got.exit_code == 0 and want.exit_code == 0, got.stderr
    got_info, want_info = json.loads(got.output), json.loads(want.output)
    assert got_info.pop("path") == url and want_info.pop("path") == str(folder)
    if name == "memmap":  # a memmap dataset is mapped from a folder: no samples from a URL (and two runs)
        assert got_info.pop("samples") == [] and len(want_info.pop("samples")) == 2
        got_info.pop("created"), want_info.pop("created")
    assert got_info == want_info
    text = run_cli("inspect", url)
    assert text.exit_code == 0 and text.output.startswith(f"{url}: {got_info['format']} dataset, "), text.output
    lines = run_cli("inspect", folder).output.splitlines()[1:]
    assert text.output.splitlines()[1:] == [ln for ln in lines if name != "memmap" or "event " not in ln
                                            and not ln.startswith("    ")]


# -- http(s): no listing; each file's size and identity looked at when it is read ----------------------

from test_http_inputs import served  # noqa: E402,F401  (the fixture)


@pytest.fixture
def web(served: tuple[str, Path]) -> tuple[str, Path]:  # noqa: F811
    """The web server of ``test_http_inputs.py`` (ranges, ETags): (base URL, its folder)."""
    pytest.importorskip("aiohttp", reason="http:// needs aiohttp (pip install 'shardsmith[http]')")
    return served


def test_verify_and_inspect_over_http(web, local):  # noqa: F811
    base, root = web
    shutil.copytree(local["tokens"], root / "tokens")
    url = f"{base}/tokens"
    got, want = run_cli("verify", url, "--deep"), run_cli("verify", local["tokens"], "--deep")
    assert got.exit_code == 0, got.output + got.stderr
    assert _summary(got.output) == _summary(want.output)
    info = json.loads(run_cli("inspect", url, "--json").output)
    assert info["path"] == url and info["format"] == "tokens"
    shard = sorted((root / "tokens").glob("train-*.bin"))[0]
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-2])
    assert _fails(run_cli("verify", url)) == [f"FAIL {shard.name}: {size - 2} bytes, the manifest says {size}"]


# -- root://: an XRootD server (``test_xrootd_inputs.py``'s); listed, each file's identity looked at -----

def test_verify_and_inspect_over_xrootd(server, local):  # noqa: F811
    host, data = server
    shutil.copytree(local["hdf5"], data / "hdf5")
    for folder, _dirs, names in os.walk(data / "hdf5"):  # the server runs as its own user
        os.chmod(folder, 0o755)
        for n in names:
            os.chmod(os.path.join(folder, n), 0o644)
    url = f"root://{host}//hdf5"
    got, want = run_cli("verify", url, "--deep"), run_cli("verify", local["hdf5"], "--deep")
    assert got.exit_code == 0, got.output + got.stderr
    assert _summary(got.output) == _summary(want.output)
    info = json.loads(run_cli("inspect", url, "--json").output)
    assert info["path"] == url and info["format"] == "hdf5" and info["samples"]
    shard = sorted((data / "hdf5").glob("train-*.h5"))[0]
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 1
    shard.write_bytes(bytes(raw))
    fails = _fails(run_cli("verify", url))
    assert len(fails) == 1 and fails[0].startswith(f"FAIL {shard.name}: sha256 "), fails
