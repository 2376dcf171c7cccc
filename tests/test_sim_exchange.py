"""bench/sim_exchange.py: the simulation of the exchange runs the engine's own code on part files
whose payloads are holes, counts what each unit does, and extrapolates only from what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from sim_today import task_runs, write_part  # noqa: E402
from sim_workload import Workload  # noqa: E402

from shardsmith.engine.shuffle import PartWriter, read_part_footer, sorted_lengths  # noqa: E402
from shardsmith.kit.batches import Segment  # noqa: E402


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One --quick run (two toy sizes measured, three fitted), its JSON and its printed table."""
    work = tmp_path_factory.mktemp("sim")
    res = subprocess.run([sys.executable, ROOT / "bench" / "sim_exchange.py", "--quick", "--json", work / "out.json",
                          "--workdir", work / "parts"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads((work / "out.json").read_text()), res.stdout, work


def test_every_size_has_every_unit_row_measured_or_fitted(quick):
    data, out, work = quick
    sizes = data["sizes"]
    assert [s["workload"]["name"] for s in sizes] == ["25 MB / 2 ranks", "100 MB / 4 ranks", "1 TB / 100 ranks",
                                                      "10 TB / 1,000 ranks", "100 TB / 4,000 ranks"]
    for s in sizes:
        rows = s["rows"]["today"]
        assert list(rows) == ["scatter", "plan", "gather", "finalize"]
        want = "m" if s["built"] else "f"
        for label, row in rows.items():
            assert row["source"] == want
            for metric in ("opens", "meta_read", "cpu"):
                assert row[metric] is not None and row[metric] >= 0, (s["workload"]["name"], label, metric)
            assert (row["rss"] is None) == (label == "plan")  # the plan is a phase of a gather unit
        assert s["totals"]["today"]["units"] == 2 * s["workload"]["ranks"] + 1
    assert "gather" in out and "[f]" in out and "fits of today's measured units" in out
    assert list((work / "parts").iterdir()) == []  # each size's part files are removed after it


def test_a_gather_unit_opens_every_footer_twice_then_each_part_once_per_group(quick):
    data, _, _ = quick
    built = [s for s in data["sizes"] if s["built"]]
    opens = []
    for s in built:
        parts = s["workload"]["tasks"]
        gathers = [u for u in s["units"]["today"] if u["kind"] == "gather"]
        assert len(gathers) == min(3, s["workload"]["ranks"])
        for u in gathers:
            tables, read = u["phases"]["tables"], u["phases"]["read"]
            # run.json and group-budget.json, then each footer in _scattered and again in split_tables
            assert tables["opens"] - 2 * parts in (3, 4), (s["workload"]["name"], u["unit"], tables["opens"])
            assert read["opens"] == u["counted"]["read_pairs"] == s["every_rank"][u["rank"]]["pairs"]
            # what its read calls returned: the heads and payload of its groups (holes read as zeros)
            assert read["bytes_read"] >= u["counted"]["read_heads"] + u["counted"]["read_payload"]
        busiest = max(gathers, key=lambda u: u["phases"]["read"]["opens"])
        assert busiest["counted"]["read_pairs"] == max(r["pairs"] for r in s["every_rank"])
        opens.append(busiest["phases"]["tables"]["opens"] + busiest["phases"]["read"]["opens"])
    # 16 -> 50 parts, 64 -> 256 buckets, 10 -> 84 groups: the busiest unit's opens grow ~10x for 4x the data
    assert opens[1] > 5 * opens[0], opens


def test_the_shape_the_fits_are_evaluated_at_matches_the_parts_where_they_exist(quick):
    from sim_exchange import shape_checks

    data, _, _ = quick
    for entry in (s for s in data["sizes"] if s["built"]):
        checks = shape_checks(entry, "today")
        assert set(checks) == {"segments", "footer_bytes", "read_pairs", "plan_pairs"}
        for key, (sampled, counted) in checks.items():
            assert sampled == pytest.approx(counted, rel=0.1), (entry["workload"]["name"], key)


def test_the_fits_extrapolate_what_was_measured(quick):
    data, _, _ = quick
    fits = {(f["law"]["row"], f["law"]["metric"], f["law"]["phase"]): f for f in data["fits"]["today"]}
    assert fits[("gather", "opens", "tables")]["b"] == [pytest.approx(2, abs=0.05)]
    assert fits[("gather", "opens", "read")]["b"] == [pytest.approx(1, abs=1e-6)]
    target = {s["workload"]["name"]: s for s in data["sizes"] if not s["built"]}
    one, ten = target["1 TB / 100 ranks"], target["10 TB / 1,000 ranks"]
    for s in (one, ten):
        shape, rows = s["shape"]["today"], s["rows"]["today"]
        f = fits[("gather", "opens", "tables")]
        r = fits[("gather", "opens", "read")]
        p = fits[("gather", "opens", "plan")]  # a unit that finds the plan opens its file: a constant
        assert p["b"] == []
        want = f["a"] + f["b"][0] * shape["parts"] + r["a"] + r["b"][0] * shape["read_pairs"] + p["a"]
        assert rows["gather"]["opens"] == pytest.approx(want, rel=1e-9)
    assert ten["rows"]["today"]["finalize"]["rss"] > one["rows"]["today"]["finalize"]["rss"]


def test_a_sparse_part_is_the_part_writers_but_the_payload(tmp_path):
    """The simulation's part file has the engine's layout: the same footer, and the same heads where
    the gather reads them, as ``shuffle.PartWriter`` writes from the same documents with payloads."""
    wl = Workload(input_bytes=20_000_000, ranks=1, memory=16_000_000)
    task = wl.tasks[0]
    runs, n = task_runs(wl, task)
    assert n > 300 and len(runs) > 16
    meta = {"task": 0, "records": n}
    real = PartWriter(tmp_path / "real.bin")
    for split, bucket, keys, order, lengths in runs:
        payload = np.random.default_rng(bucket).integers(0, 255, int(lengths.sum()), dtype=np.uint8).tobytes()
        real.add(split=split, bucket=bucket, keys=keys, order=order, lengths=lengths, payload=payload)
    real.write(meta)
    got = write_part(tmp_path / "sim.bin", runs, meta)
    assert got["payload"] == sum(int(r[4].sum()) for r in runs)
    assert read_part_footer(tmp_path / "sim.bin") == read_part_footer(tmp_path / "real.bin")
    assert (tmp_path / "sim.bin").stat().st_size == (tmp_path / "real.bin").stat().st_size
    for _, _, offset, count, nbytes in read_part_footer(tmp_path / "sim.bin")["segments"]:
        seg = [Segment(str(tmp_path / "sim.bin"), offset, count, nbytes)]
        both = [Segment(str(tmp_path / "real.bin"), offset, count, nbytes)]
        assert np.array_equal(sorted_lengths(seg), sorted_lengths(both))
    skipped = write_part(tmp_path / "holes.bin", runs, meta, heads_of=lambda split, bucket: bucket != runs[0][1])
    assert skipped == got and read_part_footer(tmp_path / "holes.bin") == read_part_footer(tmp_path / "real.bin")
    first = runs[0]
    seg = [Segment(str(tmp_path / "holes.bin"), 0, len(first[2]), int(first[4].sum()))]
    assert not sorted_lengths(seg).any()  # a head not written reads as zeros
