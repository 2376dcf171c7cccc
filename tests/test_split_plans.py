"""The plan unit's files (``engine/shuffle/split_plans.py``): a gather unit reads its groups' rows of a
split's table, and nothing of the other groups' rows."""

from __future__ import annotations

import numpy as np
import pytest

from shardsmith.engine.shuffle.partfile import Footers, PartWriter
from shardsmith.engine.shuffle.segments import BucketRuns, split_segments
from shardsmith.engine.shuffle.shard_plan import SplitPlan
from shardsmith.engine.shuffle.spilled_tables import SpilledSplit, slices_for, spill_tables
from shardsmith.engine.shuffle.split_gather import SplitGather, SplitGroups
from shardsmith.engine.shuffle.split_plans import PlanFile, PlannedSplit
from shardsmith.errors import DatasetError

SPLITS = ["train", "val"]
BUDGET = 4_000  # a gather group's bytes


class _Removals:
    """A dedup rule's removals: input order 1000 * bucket + 1 of every third bucket."""

    def orders(self, buckets: list[int]) -> np.ndarray | None:
        got = [1000 * b + 1 for b in buckets if b % 3 == 0]
        return np.asarray(got, np.uint64) if got else None

    def nbytes(self, buckets: list[int]) -> int:
        return 7 * sum(1 for b in buckets if b % 3 == 0)


def _parts(tmp_path, n_parts: int = 5, seed: int = 3) -> list[str]:
    """Part files as the scatter writes them: runs of random (split, bucket)s, flushed often (a
    bucket then has several segments in a part), payloads of random bytes."""
    rng = np.random.default_rng(seed)
    paths = []
    for p in range(n_parts):
        path = tmp_path / f"part-{p:06d}.bin"
        writer = PartWriter(path, flush_bytes=3_000)
        for _ in range(int(rng.integers(20, 60))):
            n = int(rng.integers(1, 9))
            lengths = rng.integers(10, 300, n).astype(np.uint64)
            writer.add(split=int(rng.integers(0, 2)), bucket=int(rng.integers(0, 40)),
                       keys=rng.integers(0, 1 << 60, n).astype(np.uint64), order=rng.integers(0, 1 << 30, n).astype(np.uint64),
                       lengths=lengths, payload=rng.bytes(int(lengths.sum())))
        writer.write({"task": p})
        paths.append(str(path))
    return paths


def _whole(paths, removals=None) -> list[SplitGather]:
    """The splits' tables held whole (a local run's)."""
    return [SplitGather.of(name, table, budget=BUDGET, removals=removals)
            for name, table in zip(SPLITS, split_segments(paths, len(SPLITS), footers=Footers()))]


def _spilled(tmp_path, paths, *, budget: int = 1 << 30, removals=None) -> list[tuple[SpilledSplit, PlanFile]]:
    """The same tables as the plan unit builds them, a slice of buckets at a time, each sorted into
    its plan file (``planned-x-NAME.bin``, finished by the caller)."""
    tables = spill_tables(paths, SPLITS, folder=tmp_path / "planning", budget=budget, span=40, footers=Footers())
    out = []
    for table in tables:
        plan_file = PlanFile(tmp_path / f"planned-x-{table.name}.bin", rows=table.rows, paths=table.paths,
                             tmp_dir=tmp_path / "planning")
        table.sort_into(plan_file)
        table.groups = SplitGroups.of(table.runs, budget=BUDGET, removals=removals)
        out.append((table, plan_file))
    return out


@pytest.mark.parametrize("budget", [1, 20_000, 1 << 30])
def test_the_plan_units_tables_built_a_slice_at_a_time_are_the_tables_held_whole(tmp_path, budget):
    paths = _parts(tmp_path)
    whole, spilled = _whole(paths, _Removals()), _spilled(tmp_path, paths, budget=budget, removals=_Removals())
    assert slices_for(300, budget, 40) == (40 if budget == 1 else 1 if budget == 1 << 30 else 2)
    for want, (got, plan_file) in zip(whole, spilled):
        assert got.name == want.name and got.rows == len(want.segments) > 50
        rows = got.segments(0, got.rows)
        for col in ("part", "offset", "count", "payload"):
            np.testing.assert_array_equal(getattr(rows, col), getattr(want.segments, col))
        groups = got.groups
        np.testing.assert_array_equal(groups.bounds, want.bounds)
        np.testing.assert_array_equal(groups.starts, want.starts)
        assert groups.drop_bytes == want.drop_bytes and len(groups.drops) == len(want.drops) > 3
        for a, b in zip(groups.drops, want.drops):
            assert (a is None) == (b is None) and (a is None or np.array_equal(a, b))
        for g in range(len(groups.bounds) - 1):
            assert got.group_payload(g) == want.group_payload(g)
            np.testing.assert_array_equal(got.group(g).offset, want.group(g).offset)
        plan_file.abort()
    assert [p.name for p in (tmp_path / "planning").rglob("rows-*")] == []  # each slice's rows let go once sorted


def test_a_part_file_naming_a_split_the_run_lacks_is_one_line(tmp_path):
    paths = _parts(tmp_path, n_parts=2)
    with pytest.raises(DatasetError, match="names split 1 of a run with 1"):
        spill_tables(paths, ["train"], folder=tmp_path / "planning", budget=1 << 20, span=40, footers=Footers())


def test_the_buckets_of_slices_joined_are_those_of_the_whole(tmp_path):
    paths = _parts(tmp_path)
    table = split_segments(paths, len(SPLITS), footers=Footers())[0]
    cut = len(table.bucket) // 2
    while table.bucket[cut] == table.bucket[cut - 1]:
        cut += 1
    halves = [BucketRuns.of_rows(bucket=table.bucket[a:b], count=table.segments.count[a:b],
                                 payload=table.segments.payload[a:b]) for a, b in ((0, cut), (cut, len(table.bucket)))]
    joined, whole = BucketRuns.joined(halves), BucketRuns.of(table)
    for f in ("ids", "first", "nbytes", "count", "payload"):
        np.testing.assert_array_equal(getattr(joined, f), getattr(whole, f))


@pytest.mark.parametrize("dedup", [False, True])
def test_a_gather_reads_its_groups_rows_of_the_plan_and_nothing_else(tmp_path, dedup):
    paths = _parts(tmp_path)
    removals = _Removals() if dedup else None
    split, (table, plan_file) = _whole(paths, removals)[0], _spilled(tmp_path, paths, removals=removals)[0]
    assert split.groups > 6
    plan = SplitPlan(bounds=[0, 100, int(split.samples)], weights=[0, 5, 9])
    path = tmp_path / "planned-x-train.bin"
    assert not path.exists()  # (not under its name before it is finished)
    plan_file.finish(name=table.name, groups=table.groups, plan=plan)
    g0, g1 = 2, 5
    # every row of the other groups overwritten on disk: the window must not see it
    data = bytearray(path.read_bytes())
    rows, start = len(split.segments), 16  # after the magic and row count: part int32, then offset, count, payload int64
    r0, r1 = int(split.bounds[g0]), int(split.bounds[g1])
    at = start
    for width in (4, 8, 8, 8):
        for r in (*range(r0), *range(r1, rows)):
            data[at + width * r:at + width * (r + 1)] = b"\xff" * width
        at += width * rows
    path.write_bytes(bytes(data))

    got = PlannedSplit(path=path, work=tmp_path, origins=None)
    assert (got.name, got.samples, got.plan) == ("train", split.samples, plan)
    assert got.drop_bytes == (split.drop_bytes or [0] * split.groups)
    window = got.table(g0, g1)
    assert len(window.segments) == r1 - r0  # its rows only
    assert window.segments.paths == split.segments.paths
    np.testing.assert_array_equal(window.starts, split.starts)
    for g in range(g0, g1):
        a, b = window.group(g), split.group(g)
        for col in ("part", "offset", "count", "payload"):
            np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
        want = split.drop(g)
        assert (window.drop(g) is None) == (want is None) and (want is None or np.array_equal(window.drop(g), want))
    with pytest.raises(AssertionError, match="outside the rows read"):
        window.group(g1)


def test_a_torn_plan_file_is_one_line(tmp_path):
    table, plan_file = _spilled(tmp_path, _parts(tmp_path))[0]
    path = tmp_path / "planned-x-train.bin"
    plan_file.finish(name=table.name, groups=table.groups, plan=None)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DatasetError, match="run --stage plan"):
        PlannedSplit(path=path, work=tmp_path, origins=None)
