"""root:// inputs from a real XRootD server: the Debian ``xrootd-server`` package, started here as its
own unprivileged user (it refuses to run as root), serving a folder of the shared ROOT files. The
inputs are listed through fsspec-xrootd (``engine/inputs/url_inputs.py``) and read in place by uproot (only the
baskets of the branches read are fetched), and the output must equal a run on the same files on
local disk, byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port, root_data, run_cli, tree_digest


def _why_not() -> str | None:
    if shutil.which("xrootd") is None:
        return "the XRootD server is not installed (.ci/run installs xrootd-server with apt-get)"
    if os.geteuid() != 0:
        return "starting xrootd as its own user needs root"
    try:
        pwd.getpwnam("xrootd")
    except KeyError:
        return "no 'xrootd' user (the xrootd-server package creates it)"
    for module in ("XRootD", "fsspec_xrootd"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'shardsmith[xrootd]')"
    return None


_SERVED: dict[str, int] = {}  # the server's process id, to count the bytes it read for its clients


def _bytes_served() -> int:
    """Bytes the XRootD server process has read so far (its ``rchar``): what its clients fetched."""
    with open(f"/proc/{_SERVED['pid']}/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar"))




@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Path]]:
    """``(HOST:PORT, served folder)``: events/a.root, events/more/b.root (the same tree twice), and
    big/pulses.root (9 MB of IceCube-like pulses, ten branches)."""
    why = _why_not()
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="shardsmith-xrootd-"))  # not under pytest's 0700 tmp: xrootd reads it
    try:
        data, run = base / "data", base / "run"
        (data / "events" / "more").mkdir(parents=True)
        hzz = root_data() / "uproot-HZZ.root"
        shutil.copyfile(hzz, data / "events" / "a.root")
        shutil.copyfile(hzz, data / "events" / "more" / "b.root")
        from shardsmith.demo.root_files import make_icecube_like

        make_icecube_like(data / "big" / "pulses.root", events=40_000, mean_pulses=20, seed=1)
        for folder, _dirs, files in os.walk(base):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        run.mkdir()
        shutil.chown(run, user="xrootd", group="xrootd")
        port = free_port()
        config = run / "xrootd.cfg"
        config.write_text(f"all.export /\noss.localroot {data}\nxrd.port {port}\nall.adminpath {run}\n"
                          f"all.pidpath {run}\n")
        proc = subprocess.Popen(["setpriv", "--reuid=xrootd", "--regid=xrootd", "--clear-groups", "xrootd", "-c",
                                 str(config), "-l", str(run / "xrootd.log")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _SERVED["pid"] = proc.pid  # setpriv executes xrootd in its own process
        try:
            deadline = time.monotonic() + 15
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log = (run / "xrootd.log").read_text() if (run / "xrootd.log").exists() else ""
                        pytest.fail(f"xrootd did not start: {log[-500:]}")
                    time.sleep(0.1)
            yield f"localhost:{port}", data
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_folder_on_the_server_converts_as_its_local_copy(server, tmp_path):
    host, data = server
    remote, local = tmp_path / "remote", tmp_path / "local"
    res = run_cli("convert", f"root://{host}//events/", "--to", "hdf5", "--workers", "2", "--step-size", "64KB",
                  "-o", remote, "-q")
    assert res.exit_code == 0, res.stderr
    assert run_cli("convert", data / "events", "--to", "hdf5", "--workers", "2", "--step-size", "64KB",
                   "-o", local, "-q").exit_code == 0
    assert tree_digest(remote) == tree_digest(local)

    manifest = json.loads((remote / "manifest.json").read_text())
    assert manifest["source"]["inputs"] == ["a.root", "more/b.root"]
    assert manifest["source"]["input_root"] == f"root://{host}//events/"
    assert not (tmp_path / ".remote.shardsmith-work").exists()  # nothing staged is left


def test_a_few_branches_fetch_only_their_baskets(server, tmp_path):
    """ROOT files are read in place (``RootReader.opens_urls``), not copied: a job reading three
    small branches of a 9 MB file fetches a small part of it, and writes the bytes of a local run."""
    host, data = server
    size = (data / "big" / "pulses.root").stat().st_size
    common = ["--to", "hdf5", "--workers", "2", "--branches", "event_id,azimuth,zenith", "-q"]
    before = _bytes_served()
    res = run_cli("convert", f"root://{host}//big/", "-o", tmp_path / "remote", *common)
    assert res.exit_code == 0, res.stderr
    served = _bytes_served() - before
    assert run_cli("convert", data / "big", "-o", tmp_path / "local", *common).exit_code == 0
    assert tree_digest(tmp_path / "remote") == tree_digest(tmp_path / "local")
    print(f"fetched {served} of {size} bytes ({served / size:.1%})")
    assert served < size * 0.25, f"{served} bytes served for a {size}-byte file"


def test_one_file_on_the_server_into_tar(server, tmp_path):
    host, data = server
    res = run_cli("convert", f"root://{host}//events/more/b.root", "--to", "webdataset", "--branches", "Muon_*,NMuon",
                  "-o", tmp_path / "remote", "-q")
    assert res.exit_code == 0, res.stderr
    assert run_cli("convert", data / "events" / "more" / "b.root", "--to", "webdataset", "--branches",
                   "Muon_*,NMuon", "-o", tmp_path / "local", "-q").exit_code == 0
    assert tree_digest(tmp_path / "remote") == tree_digest(tmp_path / "local")


def test_a_missing_path_and_a_silent_server_are_one_line(server, tmp_path):
    host, _ = server
    res = run_cli("convert", f"root://{host}//nope/", "--to", "hdf5", "-o", tmp_path / "a", "-q")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [f"shardsmith: error: root://{host}//nope/: no such file or folder "
                                               f"on the server"]
    t0 = time.monotonic()
    res = run_cli("convert", f"root://localhost:{free_port()}//events/", "--to", "hdf5", "-o", tmp_path / "b", "-q",
                  "--retries", "1", "--retry-wait", "0.05")  # a refused connection is retried (test_xrootd_faults)
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1 and "Connection" in res.stderr
    assert "cannot list it after 2 attempts" in res.stderr
    assert time.monotonic() - t0 < 30
