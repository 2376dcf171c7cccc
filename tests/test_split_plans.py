"""The plan unit's files (``engine/shuffle/split_plans.py``): a gather unit reads its groups' rows of a
split's table, and nothing of the other groups' rows."""

from __future__ import annotations

import numpy as np
import pytest

from shardsmith.engine.shuffle.segments import Segments, SplitSegments
from shardsmith.engine.shuffle.shard_plan import SplitPlan
from shardsmith.engine.shuffle.split_gather import SplitGather
from shardsmith.engine.shuffle.split_plans import PlannedSplit, write_split
from shardsmith.errors import DatasetError


class _Removals:
    """A dedup rule's removals: input order 1000 * bucket + 1 of every third bucket."""

    def orders(self, buckets: list[int]) -> np.ndarray | None:
        got = [1000 * b + 1 for b in buckets if b % 3 == 0]
        return np.asarray(got, np.uint64) if got else None

    def nbytes(self, buckets: list[int]) -> int:
        return 7 * sum(1 for b in buckets if b % 3 == 0)


def _split(tmp_path, *, removals=None) -> SplitGather:
    rng = np.random.default_rng(3)
    n = 600
    bucket = np.sort(rng.integers(0, 40, n)).astype(np.int64)
    paths = [str(tmp_path / f"part-{p:06d}.bin") for p in range(5)]
    seg = Segments(paths=paths, part=rng.integers(0, 5, n).astype(np.int32), offset=np.arange(n, dtype=np.int64) * 64,
                   count=rng.integers(1, 9, n).astype(np.int64), payload=rng.integers(10, 900, n).astype(np.int64))
    return SplitGather.of("train", SplitSegments(segments=seg, bucket=bucket), budget=20_000, removals=removals)


@pytest.mark.parametrize("dedup", [False, True])
def test_a_gather_reads_its_groups_rows_of_the_plan_and_nothing_else(tmp_path, dedup):
    split = _split(tmp_path, removals=_Removals() if dedup else None)
    assert split.groups > 6
    plan = SplitPlan(bounds=[0, 100, int(split.samples)], weights=[0, 5, 9])
    path = tmp_path / "planned-x-train.bin"
    write_split(path, split, plan)
    g0, g1 = 2, 5
    # every row of the other groups overwritten on disk: the window must not see it
    data = bytearray(path.read_bytes())
    rows, tail = len(split.segments), 4 + 8 + 8 + 8  # part int32, then offset, count, payload int64
    start = len(data) - rows * tail
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
    split = _split(tmp_path)
    path = tmp_path / "planned-x-train.bin"
    write_split(path, split, None)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DatasetError, match="run --stage plan"):
        PlannedSplit(path=path, work=tmp_path, origins=None)
