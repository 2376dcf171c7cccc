"""bench/bench_exchange.py: pack-tokens' stages as processes, each metered; a smoke run at a toy size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.heavy
def test_a_quick_run_meters_every_unit_and_checks_the_targets(tmp_path):
    res = subprocess.run([sys.executable, ROOT / "bench" / "bench_exchange.py", "--quick", "--workdir", tmp_path / "w",
                          "--json", tmp_path / "out.json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads((tmp_path / "out.json").read_text())
    (cfg,) = got["configs"]
    assert cfg["identical"] and not cfg["error"] and cfg["parts"] >= 1
    units = {(u["stage"], u["rank"]) for u in cfg["units"]}
    assert units == {("scatter", 0), ("scatter", 1), ("plan", 0), ("gather", 0), ("gather", 1), ("finalize", 0)}
    gather = [u["m"] for u in cfg["units"] if u["stage"] == "gather"]
    # the meter saw the unit's reads of the parts: their payload, and opens of files in the scratch folder
    assert sum(m["payload"] for m in gather) > 0 and all(m["opens"] > 0 and m["rss"] > 0 for m in gather)
    assert "PASS  output bytes equal the one-process run's" in res.stdout
    assert not (tmp_path / "w" / "corpus-3mb.jsonl").exists()  # the corpus is removed unless --keep-corpus
