"""`make bench` (bench/suite.py): it knows every benchmark, refuses an unknown name, and runs one end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import suite  # noqa: E402


def test_the_suite_lists_every_benchmark_file():
    files = {p.stem.removeprefix("bench_") for p in (ROOT / "bench").glob("bench_*.py")}
    assert files == set(suite.BY_NAME), "add the new benchmark to bench/suite.py's SUITE"
    assert all(b.script.is_file() for b in suite.SUITE)


def test_an_unknown_name_is_one_line_and_exit_2():
    res = subprocess.run([sys.executable, ROOT / "bench" / "suite.py", "--only", "mix,nope"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"bench: no benchmark named nope (known: {', '.join(suite.BY_NAME)})"]


def test_one_benchmark_runs_through_the_suite_into_its_folder(tmp_path):
    res = subprocess.run([sys.executable, ROOT / "bench" / "suite.py", "--only", "minhash_core", "--out", tmp_path],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    table = res.stdout.split("figures\n", 1)[1]
    assert table.startswith("minhash_core   ok"), res.stdout
    log = (tmp_path / "minhash_core.log").read_text()
    assert log.startswith("$ ") and "bench_minhash_core.py" in log.splitlines()[0]
