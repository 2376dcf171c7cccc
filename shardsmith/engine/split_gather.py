"""A split as the gather reads it (its bucket groups in key order, where each starts, what a dedup
rule removed) and as the gather leaves it (its shards and split-wide records): the tables that the
gather's planning (``shard_plan.py``), its writers (``gather.py``) and the run (``run.py``) share."""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shardsmith.core.ragged import starts_of
from shardsmith.engine.shuffle import Origins, groups
from shardsmith.kit.batches import Segment
from shardsmith.kit.writer import ShardRecord


@dataclass
class SplitGather:
    """One split as the gather reads it: its bucket groups in key order and where each starts,
    less the samples a dedup rule removed (``Removals``), with their documents' origins when the
    run keeps them (``--provenance``)."""

    name: str
    groups: list[list[Segment]]
    starts: np.ndarray  # sample position of each group's first kept sample, then the split's size
    drops: list[np.ndarray | None] = field(default_factory=list)  # per group: input orders left out (sorted)
    drop_bytes: list[int] = field(default_factory=list)  # per group: their payload bytes
    origins: Origins | None = None
    # made here, in the parent: a forked gather worker reads only its own range's groups (touching the
    # others' objects would copy their pages into it: ~85 MB a worker at a 10 GB input, issue 31)
    max_group_bytes: int = field(init=False, default=0)  # the largest group's heads and payloads
    part_files: int = field(init=False, default=0)  # the part files its groups read

    def __post_init__(self) -> None:
        self.max_group_bytes = max((sum(s.nbytes + mmap.PAGESIZE for s in g) for g in self.groups), default=0)
        self.part_files = len({seg.path for g in self.groups for seg in g})

    @classmethod
    def of(cls, name: str, buckets: dict[int, list[Segment]], *, budget: int, removals: Removals | None = None,
           origins: Origins | None = None) -> SplitGather:
        grouped = groups(buckets, budget=budget)
        drops = [None if removals is None else removals.orders(ids) for ids, _ in grouped]
        drop_bytes = [0 if removals is None else removals.nbytes(ids) for ids, _ in grouped]
        counts = [sum(s.count for s in g) - (0 if d is None else len(d)) for (_, g), d in zip(grouped, drops)]
        return cls(name=name, groups=[g for _, g in grouped], starts=starts_of(np.asarray(counts, dtype=np.int64)),
                   drops=drops, drop_bytes=drop_bytes, origins=origins)

    @property
    def samples(self) -> int:
        return int(self.starts[-1])

    def drop(self, g: int) -> np.ndarray | None:
        return self.drops[g] if self.drops else None


class Removals(Protocol):
    """The samples of one split a dedup rule removed, by bucket (``engine/duplicates.py``)."""

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
