"""bench/sim_exchange.py: the simulation of the exchange runs the engine's own units on part files
whose payloads are holes, counts what each unit does as a real staged run counts it (checked
against one), and extrapolates only from what it measured."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from sim_check import RealRun, real_run, simulated  # noqa: E402
from sim_today import task_runs, write_part  # noqa: E402
from sim_workload import Workload  # noqa: E402

from shardsmith.engine.shuffle.buckets import sorted_lengths  # noqa: E402
from shardsmith.engine.shuffle.open_parts import OpenParts  # noqa: E402
from shardsmith.engine.shuffle.partfile import PartWriter, read_footer  # noqa: E402
from shardsmith.engine.shuffle.segments import Segments  # noqa: E402


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A real pack-tokens run of ~0.6 MB on 2 ranks, every stage a process of its own, measured."""
    root = tmp_path_factory.mktemp("real")
    return real_run(root, nbytes=600_000, ranks=2, files=2, memory=2_000_000, shard_tokens=150_000, seed=0), root


def test_the_simulation_counts_what_a_real_staged_run_counts(real):
    run, root = real
    got = simulated(run, root)
    assert got["parts_equal"] and got["parts"] == run.workload.task_count >= 2
    for unit in got["units"]:
        assert unit["real"] == unit["sim"], unit
    units = {u["unit"]: u["real"] for u in got["units"]}
    parts = got["parts"]
    for rank in (0, 1):
        gather = units[f"gather {rank}"]
        # no footer (its rows of the plan instead): only its groups' parts, punched through the same descriptors
        read = next(c["counted"] for c in got["counted"] if c["unit"] == f"gather {rank}")
        assert gather["part_opens"] == read > 0 and gather["punches"] > 0 and gather["meta_read"] > 0
        assert units[f"scatter {rank}"]["part_opens"] == len([t for t in run.workload.tasks if t.index % 2 == rank])
    assert units["plan"]["part_opens"] >= 2 * parts  # every footer twice (the meta, the index), then heads
    assert units["finalize"]["part_opens"] == 0  # the plan's index and the tasks' results: no footer
    # the count the totals use for ranks a large run does not measure equals what a simulated unit opened
    assert got["counted"] and all(c["measured"] == c["counted"] > 0 for c in got["counted"])
    assert got["ok"]


def test_the_self_check_fails_a_simulation_that_writes_other_parts(real):
    run, root = real
    other = RealRun(units=run.units, workload=dataclasses.replace(run.workload, seed=1), parts=run.parts)
    got = simulated(other, root)  # the keys of another seed: other buckets, other segments
    assert not got["parts_equal"] and not got["ok"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One --quick run (two toy sizes measured, three fitted), its JSON and its printed table."""
    work = tmp_path_factory.mktemp("sim")
    res = subprocess.run([sys.executable, ROOT / "bench" / "sim_exchange.py", "--quick", "--no-check", "--json",
                          work / "out.json", "--workdir", work / "parts"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
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
        for label, row in rows.items():
            assert row["source"] == ("m" if s["built"] else "f")
            for metric in ("opens", "meta_read"):
                assert row[metric] is not None and row[metric] >= 0, (s["workload"]["name"], label, metric)
            assert (row["rss"] is None) == (label == "scatter")  # the scatter is not the engine's
            if not s["built"]:  # an extrapolated figure carries its fit's error on the measured sizes
                assert row["error"]["opens"] is not None
        totals = s["totals"]["today"]
        assert totals["units"] == 2 * s["workload"]["ranks"] + 2
        assert totals["shared"] == pytest.approx(totals["meta_read"] + totals["payload_read"] + totals["written"])
    assert "in all" in out and " f\n" in out and "fits of today's measured units" in out
    assert list((work / "parts").iterdir()) == []  # each size's part files are removed after it


def test_the_plan_unit_opens_every_footer_twice_and_a_gather_unit_none_then_each_part_once(quick):
    data, _, _ = quick
    for s in (s for s in data["sizes"] if s["built"]):
        parts, every = s["workload"]["tasks"], s["every_rank"]["today"]
        gathers = [u for u in s["units"]["today"] if u["kind"] == "gather"]
        assert {u["rank"] for u in gathers} == set(range(s["workload"]["ranks"]))  # few ranks: every one measured
        for u in gathers:
            tables, read = u["phases"]["tables"], u["phases"]["read"]
            assert tables["part_opens"] == 0  # its rows of the plan unit's tables, no footer
            # each part its ranges' groups read once for the unit (not once a group, nor a range); it punches
            # through the same descriptors
            assert read["part_opens"] == every[u["rank"]]["pairs"] <= parts and every[u["rank"]]["punches"] >= 0
            assert read["payload_read"] == every[u["rank"]]["payload"]
        fin = next(u for u in s["units"]["today"] if u["kind"] == "finalize")
        assert "finish" in fin["phases"] and fin["phases"]["tables"]["part_opens"] == 0
        plan = next(u for u in s["units"]["today"] if u["kind"] == "plan")
        assert plan["phases"]["tables"]["part_opens"] == 2 * parts  # run._scattered, then run.split_tables


def test_the_shape_the_fits_are_evaluated_at_matches_the_parts_where_they_exist(quick):
    from sim_exchange import shape_checks

    data, _, _ = quick
    for entry in (s for s in data["sizes"] if s["built"]):
        checks = shape_checks(entry, "today")
        assert set(checks) == {"segments", "footer_bytes", "read_pairs", "read_segments", "plan_pairs", "punch_pairs"}
        for key, (sampled, counted) in checks.items():
            # (the rows of a rank's groups, and the parts a range or the plan reaches: means over sampled
            # parts and groups, coarse at toy sizes)
            coarse = key in ("read_segments", "read_pairs", "plan_pairs")
            assert sampled == pytest.approx(counted, rel=0.35 if coarse else 0.1), (entry["workload"], key)


def test_the_fits_extrapolate_what_was_measured(quick):
    data, _, _ = quick
    fits = {(f["law"]["row"], f["law"]["metric"], f["law"]["phase"]): f for f in data["fits"]["today"]}
    assert fits[("plan", "opens", "tables")]["b"] == [pytest.approx(2, abs=0.05)]
    assert fits[("gather", "opens", "tables")]["b"] == []  # the plan's files, whatever the corpus
    # each (range, part) pair once (a unit's other opens, its pieces and shards, go with its share: they
    # lean on the fit a little; the part opens alone are counted exactly in the test above)
    assert fits[("gather", "opens", "read")]["b"][0] == pytest.approx(1, rel=0.1)
    target = {s["workload"]["name"]: s for s in data["sizes"] if not s["built"]}
    one, ten = target["1 TB / 100 ranks"], target["10 TB / 1,000 ranks"]
    for s in (one, ten):
        shape, rows = s["shape"]["today"], s["rows"]["today"]
        t, r = (fits[("gather", "opens", phase)] for phase in ("tables", "read"))
        want = t["a"] + r["a"] + r["b"][0] * shape["read_pairs"]
        assert rows["gather"]["opens"] == pytest.approx(want, rel=1e-9)
    # finalize reads every task's result (from the plan unit, not the footers): it grows with the corpus
    assert ten["rows"]["today"]["finalize"]["meta_read"] > 5 * one["rows"]["today"]["finalize"]["meta_read"]
    assert ten["totals"]["today"]["opens"] > 10 * one["totals"]["today"]["opens"]


def test_exchanges_are_columns_side_by_side_and_an_unknown_one_is_one_line(tmp_path, capsys):
    """``json`` (the exchange before the binary footers: ``sim_json.py``) beside today's: the same
    parts but their footers, the same opens; its plan unit reads every footer whole twice, today's
    the meta and then the index, once."""
    import sim_exchange

    got = sim_exchange.main(["--quick", "--no-check", "--sizes", "10MB/2", "--targets", "1TB/100",
                             "--exchange", "json,today", "--workdir", str(tmp_path)])
    for entry in got["sizes"]:
        assert set(entry["rows"]) == {"today", "json"}
        assert entry["rows"]["today"]["scatter"]["opens"] == entry["rows"]["json"]["scatter"]["opens"]
        assert entry["rows"]["today"]["gather"]["opens"] == entry["rows"]["json"]["gather"]["opens"]
    measured = got["sizes"][0]
    assert measured["built"]
    tables = {name: [u["phases"]["tables"] for u in measured["units"][name] if u["kind"] == "plan"]
              for name in ("json", "today")}  # (the one unit that reads the footers)
    parts = measured["workload"]["tasks"]
    for old, new in zip(tables["json"], tables["today"]):
        assert old["part_opens"] == new["part_opens"] == 2 * parts
        assert new["bytes_read"] < old["bytes_read"], (old, new)
    assert "opens json" in capsys.readouterr().out  # a column of its own
    with pytest.raises(SystemExit) as stop:
        sim_exchange.main(["--exchange", "today,nope"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "no exchange nope" in err and "Traceback" not in err


def footer(path):
    """A part's footer as read: its meta and its index rows."""
    got, rows = read_footer(path, rows=True)
    return got.meta, rows.tolist()


def test_a_sparse_part_is_the_part_writers_but_the_payload(tmp_path):
    """The simulation's part file has the engine's layout: the same footer, and the same heads where
    the gather reads them, as ``shuffle.PartWriter`` writes from the same documents with payloads."""
    wl = Workload(input_bytes=20_000_000, ranks=1, memory=16_000_000)
    task = wl.tasks[0]
    runs = task_runs(wl, task)
    n = runs.records
    assert n > 300 and len(runs) > 16
    meta = {"task": 0, "records": n}
    real = PartWriter(tmp_path / "real.bin")
    for split, bucket, keys, order, lengths in runs:
        payload = np.random.default_rng(bucket).integers(0, 255, int(lengths.sum()), dtype=np.uint8).tobytes()
        real.add(split=split, bucket=bucket, keys=keys, order=order, lengths=lengths, payload=payload)
    real.write(meta)
    got = write_part(tmp_path / "sim.bin", runs, meta)
    assert got["payload"] == sum(int(r[4].sum()) for r in runs) == int(runs.lengths.sum())
    assert footer(tmp_path / "sim.bin") == footer(tmp_path / "real.bin")
    assert (tmp_path / "sim.bin").stat().st_size == (tmp_path / "real.bin").stat().st_size
    for _, _, offset, count, nbytes in read_footer(tmp_path / "sim.bin", rows=True)[1].tolist():
        seg = Segments.of([(str(tmp_path / "sim.bin"), offset, count, nbytes)])
        both = Segments.of([(str(tmp_path / "real.bin"), offset, count, nbytes)])
        assert np.array_equal(sorted_lengths(seg, parts=OpenParts()), sorted_lengths(both, parts=OpenParts()))
    skipped = write_part(tmp_path / "holes.bin", runs, meta, heads_of=lambda split, bucket: bucket != runs.bucket[0])
    assert skipped == got and footer(tmp_path / "holes.bin") == footer(tmp_path / "real.bin")
    first = runs.run(0)
    seg = Segments.of([(str(tmp_path / "holes.bin"), 0, len(first[2]), int(first[4].sum()))])
    assert not sorted_lengths(seg, parts=OpenParts()).any()  # a head not written reads as zeros


def test_a_run_printed_again_from_its_json_runs_nothing_and_fits_the_same(quick, capsys):
    import sim_exchange

    data, _, work = quick
    again = sim_exchange.main(["--replot", str(work / "out.json"), "--targets", "1TB/100"])
    assert [s["workload"]["name"] for s in again["sizes"]] == ["25 MB / 2 ranks", "100 MB / 4 ranks", "1 TB / 100 ranks"]
    coefficients = [[(f["law"], f["a"], f["b"], f["n"]) for f in fits["today"]] for fits in (again["fits"], data["fits"])]
    assert coefficients[0] == coefficients[1]
    assert again["sizes"][2]["rows"] == data["sizes"][2]["rows"]
    for before, now in zip(data["sizes"][:2], again["sizes"][:2]):
        assert now["rows"] == before["rows"] and now["totals"] == before["totals"]
    assert list((work / "parts").iterdir()) == []
