"""tests/slurm needs a real SLURM (root, daemons): only `make test-slurm` collects it, not `make test`.

`pytest` from the repo root skips the test files here unless SHARDSMITH_SLURM_TEST=1 (what `make
test-slurm` sets); naming a file on the command line also runs it. The package's ``__init__.py`` keeps
this conftest from shadowing ``tests/conftest.py``, which the other test files import as ``conftest``.

``cluster`` (one per session, shared by test_slurm.py and test_slurm_executor.py): a running
one-node cluster started by cluster.sh, as the environment to submit with.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

collect_ignore = ([] if os.environ.get("SHARDSMITH_SLURM_TEST") == "1"
                  else ["test_slurm.py", "test_slurm_executor.py"])

CLUSTER = Path(__file__).resolve().parent / "cluster.sh"


def _free_port_pair() -> int:
    """A port p with p and p + 1 free (slurmctld, slurmd), so a cluster already here is left alone."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65000:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


@contextlib.contextmanager
def one_node_cluster(folder: Path) -> Iterator[dict[str, str]]:
    """A one-node cluster (cluster.sh) in ``folder`` on free ports: the environment to submit with.
    Stopped at the end, and checked: no daemon of it is left."""
    env = dict(os.environ, SHARDSMITH_SLURM_PORT=str(_free_port_pair()))
    try:
        res = subprocess.run(["bash", str(CLUSTER), "start", str(folder)], env=env, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, f"cluster.sh start failed:\n{res.stderr}"
        assert res.stdout.strip() == f"export SLURM_CONF={folder}/slurm.conf", res.stdout
        env["SLURM_CONF"] = str(folder / "slurm.conf")
        env["PYTHON"] = sys.executable
        yield env
    finally:
        res = subprocess.run(["bash", str(CLUSTER), "stop", str(folder)], env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        for pidfile in ("slurmctld.pid", "slurmd.pid", "munge/munged.pid"):
            assert not (folder / pidfile).exists(), f"{pidfile} left after cluster.sh stop"
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            assert str(folder) not in cmdline, f"daemon left after stop: {cmdline}"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """The session's running one-node cluster: the environment to submit with."""
    if os.geteuid() != 0:
        pytest.skip("a real SLURM cluster needs root (the daemons run as root here)")
    with one_node_cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


@pytest.fixture
def make_cluster():
    """``one_node_cluster``, for a test that needs a cluster of its own (one it may break)."""
    if os.geteuid() != 0:
        pytest.skip("a real SLURM cluster needs root (the daemons run as root here)")
    return one_node_cluster
