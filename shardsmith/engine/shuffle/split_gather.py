"""A split as the gather reads it (its bucket groups in key order, where each starts, what a dedup
rule removed) and as the gather leaves it (its shards and split-wide records): the tables that the
gather's planning (``shard_plan.py``), its writers (``gather.py``) and the run (``run.py``) share."""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shardsmith.core.ragged import starts_of
from shardsmith.engine.shuffle.buckets import Origins
from shardsmith.engine.shuffle.segments import BucketRuns, Segments, SplitSegments, group_cuts
from shardsmith.kit.writer import ShardRecord


@dataclass
class SplitGather:
    """One split as the gather reads it: its segments sorted by bucket, its bucket groups in key
    order (each a range of those rows: ``group``) and where each starts, less the samples a dedup
    rule removed (``Removals``), with their documents' origins when the run keeps them
    (``--provenance``). Arrays, not an object per segment (``engine/shuffle/segments.py``): a forked gather
    worker reads its own range's rows and copies none of the parent's pages (issue 31)."""

    name: str
    segments: Segments
    bounds: np.ndarray  # the first row of each group, then the rows
    starts: np.ndarray  # sample position of each group's first kept sample, then the split's size
    drops: list[np.ndarray | None] = field(default_factory=list)  # per group: input orders left out (sorted)
    drop_bytes: list[int] = field(default_factory=list)  # per group: their payload bytes
    origins: Origins | None = None
    # the groups whose rows ``segments`` holds (None: all of them): a staged gather unit reads only
    # its own range's rows of the plan unit's table (``split_plans.py``), the rows from ``bounds[g0]``
    window: tuple[int, int] | None = None
    max_group_bytes: int = field(init=False, default=0)  # the largest group's heads and payloads
    part_files: int = field(init=False, default=0)  # the part files its groups read
    row0: int = field(init=False, default=0)  # the table row of ``segments``' first one

    def __post_init__(self) -> None:
        g0, g1 = (0, self.groups) if self.window is None else self.window
        self.row0 = int(self.bounds[g0]) if self.groups else 0
        if g1 > g0:
            sizes = np.add.reduceat(self.segments.nbytes + mmap.PAGESIZE, self.bounds[g0:g1] - self.row0)
            self.max_group_bytes = int(sizes.max())
        self.part_files = int(np.count_nonzero(np.bincount(self.segments.part)))  # (np.unique imports numpy.ma)

    @classmethod
    def of(cls, name: str, split: SplitSegments, *, budget: int, removals: Removals | None = None,
           origins: Origins | None = None) -> SplitGather:
        groups = SplitGroups.of(BucketRuns.of(split), budget=budget, removals=removals)
        return cls(name=name, segments=split.segments, bounds=groups.bounds, starts=groups.starts, drops=groups.drops,
                   drop_bytes=groups.drop_bytes, origins=origins)

    @property
    def groups(self) -> int:
        """How many bucket groups."""
        return len(self.bounds) - 1

    def group(self, g: int) -> Segments:
        """Group ``g``'s segments."""
        return self.between(g, g + 1)

    def between(self, g0: int, g1: int) -> Segments:
        """The segments of groups ``[g0, g1)`` (consecutive rows; in the window, if the table has one)."""
        if self.window is not None and g1 > g0:
            assert self.window[0] <= g0 and g1 <= self.window[1], "a group outside the rows read"
        return self.segments[int(self.bounds[g0]) - self.row0:int(self.bounds[g1]) - self.row0]

    @property
    def samples(self) -> int:
        return int(self.starts[-1])

    def drop(self, g: int) -> np.ndarray | None:
        return self.drops[g] if self.drops else None

    def group_payload(self, g: int) -> int:
        """Group ``g``'s payload bytes (those a dedup rule removed included)."""
        return self.group(g).payload_bytes


@dataclass(frozen=True)
class SplitGroups:
    """A split's bucket groups without its segment rows: each group's first row and first kept
    sample, what a dedup rule removed of it, and its payload bytes. Made from the buckets alone
    (``BucketRuns``), the same whether the table is held whole (``SplitGather.of``) or built in the
    scratch folder a slice at a time (the plan unit's: ``engine/shuffle/spilled_tables.py``)."""

    bounds: np.ndarray  # the first row of each group, then the rows
    starts: np.ndarray  # sample position of each group's first kept sample, then the split's size
    drops: list[np.ndarray | None]  # per group: input orders left out (sorted)
    drop_bytes: list[int]  # per group: their payload bytes
    payload: np.ndarray  # per group: its payload bytes, removed samples' included

    @classmethod
    def of(cls, runs: BucketRuns, *, budget: int, removals: Removals | None = None) -> SplitGroups:
        cuts = group_cuts(runs.nbytes, budget)  # (the first bucket of each group, then the buckets)
        ids = [runs.ids[a:b].tolist() for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist())]
        drops = [None if removals is None else removals.orders(b) for b in ids]
        drop_bytes = [0 if removals is None else removals.nbytes(b) for b in ids]
        counts = np.add.reduceat(runs.count, cuts[:-1]) if ids else np.zeros(0, np.int64)
        counts = counts - np.array([0 if d is None else len(d) for d in drops], dtype=np.int64)
        payload = np.add.reduceat(runs.payload, cuts[:-1]) if ids else np.zeros(0, np.int64)
        return cls(bounds=runs.first[cuts].astype(np.int64), starts=starts_of(counts.astype(np.int64)), drops=drops,
                   drop_bytes=drop_bytes, payload=payload.astype(np.int64))


class Removals(Protocol):
    """The samples of one split a dedup rule removed, by bucket (``engine/shuffle/duplicates.py``)."""

    def orders(self, buckets: list[int]) -> np.ndarray | None:
        """The input orders removed from these buckets, sorted (None: none)."""

    def nbytes(self, buckets: list[int]) -> int:
        """Their payload bytes."""


@dataclass
class SplitOutput:
    """A finished split: its shards in order, and what its writers' finishing step added."""

    shards: list[ShardRecord]
    md5s: list[str | None] = field(default_factory=list)
    flat_record: dict[str, Any] | None = None
    events: int | None = None
