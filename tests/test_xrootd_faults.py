"""Faults of a real XRootD server (issue 15, part 4): the Debian ``xrootd`` stopped (SIGSTOP) or
killed and started again on the same port while a run downloads from it; the run retries
(``storage/retry.py``: XRootD's statuses classified in ``XROOTD_TRANSIENT``) and finishes with the
bytes of a run on the same file on local disk. A server that stays away ends the run with one line
after the retries.

The runs are child processes (``shardsmith`` as a user runs it) so that XRootD's client reads this
test's short timeouts when it loads: a request to a stopped server expires after about 2 s instead
of 60 (``XRD_REQUESTTIMEOUT``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, tree_digest
from test_xrootd_inputs import _why_not

QUICK = {"XRD_REQUESTTIMEOUT": "2", "XRD_TIMEOUTRESOLUTION": "1", "XRD_CONNECTIONWINDOW": "2"}
LINE = b'{"id": %d, "text": "document %d: the same few words again and again, then a number %d"}\n'


class Server:
    """``xrootd`` as its own user, serving ``data`` on ``port``; ``start`` again after ``kill`` takes
    the same port."""

    def __init__(self, base: Path) -> None:
        self.data, self.run = base / "data", base / "run"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"localhost:{self.port}"

    def start(self) -> None:
        config = self.run / "xrootd.cfg"
        config.write_text(f"all.export /\noss.localroot {self.data}\nxrd.port {self.port}\n"
                          f"all.adminpath {self.run}\nall.pidpath {self.run}\n")
        self.proc = subprocess.Popen(["setpriv", "--reuid=xrootd", "--regid=xrootd", "--clear-groups", "xrootd",
                                      "-c", str(config), "-l", str(self.run / "xrootd.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15

        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"xrootd did not start on port {self.port}")
                time.sleep(0.05)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def server() -> Iterator[Server]:
    """A server of ``big.jsonl`` (~60 MB: its download takes long enough to be interrupted)."""
    why = _why_not()
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="shardsmith-xrootd-faults-"))  # xrootd reads it: not pytest's 0700 tmp
    srv = Server(base)
    try:
        (srv.data / "corpus").mkdir(parents=True)
        with open(srv.data / "corpus" / "big.jsonl", "wb") as fh:
            for start in range(0, 600_000, 10_000):
                fh.write(b"".join(LINE % (i, i, i * 7919 % 100_003) for i in range(start, start + 10_000)))
        for folder, _dirs, files in os.walk(base):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        srv.run.mkdir()
        shutil.chown(srv.run, user="xrootd", group="xrootd")
        srv.start()
        yield srv
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            srv.signal(signal.SIGCONT)
            srv.kill()
        shutil.rmtree(base, ignore_errors=True)


def _shardsmith(*args: str | Path) -> tuple[subprocess.Popen[str], float]:
    env = {**os.environ, **QUICK, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, time.monotonic()


class _WhenDownloading(threading.Thread):
    """Runs ``action`` the moment a download into ``out``'s staging folder has begun (its temporary
    file holds some bytes); ``fired`` says whether it did."""

    def __init__(self, out: Path, action: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.staging = out.parent / f".{out.name}.shardsmith-work" / "inputs"
        self.action, self.fired = action, False
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for folder, _dirs, files in os.walk(self.staging):
                if any(".tmp-" in f and _size(os.path.join(folder, f)) > 0 for f in files):
                    self.fired = True
                    self.action()
                    return
            time.sleep(0.002)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # renamed meanwhile
        return 0


COMMON = ("--to", "webdataset", "--limit", "2000", "--workers", "1", "-q")


def _local_reference(server: Server, tmp_path: Path) -> dict[str, str]:
    ref = tmp_path / "ref"
    proc, _ = _shardsmith("convert", server.data / "corpus", "-o", ref, *COMMON)
    assert proc.wait(120) == 0, proc.stderr.read() if proc.stderr else ""
    return tree_digest(ref)


def _convert_while(server: Any, out: Path, disrupt: Any, *, join: float) -> tuple[float, Any]:
    """Convert the served corpus (8 retries) while ``disrupt`` runs once a download is under way;
    the run must succeed. Returns when it began and the watcher that ran ``disrupt``."""
    proc, began = _shardsmith("convert", f"root://{server.host}//corpus/", "-o", out, *COMMON,
                              "--retries", "8", "--retry-wait", "0.2")
    watcher = _WhenDownloading(out, disrupt)
    code = proc.wait(120)
    watcher.join(join)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    return began, watcher


def test_a_server_stopped_during_a_download_then_resumed(server, tmp_path):
    """SIGSTOP in the middle of the download, SIGCONT 4 s later: requests expire meanwhile
    ("Operation expired"), are retried, and the download goes on from the byte it reached."""
    expected = _local_reference(server, tmp_path)
    out = tmp_path / "got"
    stopped: list[float] = []

    def pause() -> None:
        server.signal(signal.SIGSTOP)
        stopped.append(time.monotonic())
        time.sleep(4)
        server.signal(signal.SIGCONT)

    began, watcher = _convert_while(server, out, pause, join=10)
    assert watcher.fired and stopped and time.monotonic() - began > 4, "the run waited for the stopped server"
    assert tree_digest(out) == expected


def test_a_server_killed_during_a_download_and_started_again(server, tmp_path):
    """The server process killed in the middle of the download and started again on the same port
    2 s later: the broken connection and the refused ones are retried; same bytes."""
    expected = _local_reference(server, tmp_path)
    out = tmp_path / "got"

    def restart() -> None:
        server.kill()
        time.sleep(2)
        server.start()

    _, watcher = _convert_while(server, out, restart, join=20)
    assert watcher.fired, "the server was restarted in the middle of a download"
    assert tree_digest(out) == expected


def test_a_server_that_stays_away_is_one_line_after_the_retries(server, tmp_path):
    """Killed during the download and never back: one line naming the object and the attempts."""
    out = tmp_path / "got"
    proc, began = _shardsmith("convert", f"root://{server.host}//corpus/", "-o", out, *COMMON,
                              "--retries", "2", "--retry-wait", "0.05")
    watcher = _WhenDownloading(out, server.kill)
    code = proc.wait(120)
    watcher.join(10)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert code == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"shardsmith: error: root://{server.host}//corpus/big.jsonl: cannot read it after "
                               f"3 attempts (the last: OSError: "), lines[0]
    assert "Connection error" in lines[0] or "Socket" in lines[0] or "Stream" in lines[0], lines[0]
    assert time.monotonic() - began < 30
    assert not out.exists()

    # listing a server that is not there: the same, for the listing
    proc, _ = _shardsmith("convert", f"root://{server.host}//corpus/", "-o", out, *COMMON, "--retries", "1",
                          "--retry-wait", "0.05")
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 1, stderr
    assert stderr.strip().splitlines() == [
        f"shardsmith: error: root://{server.host}//corpus/: cannot list it after 2 attempts (the last: OSError: "
        f"File stat request failed: [FATAL] Connection error)"], stderr
