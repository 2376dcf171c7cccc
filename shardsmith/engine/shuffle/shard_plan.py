"""Where a split's shards start, planned before any is written, and whether to plan them.

The samples' weights in output order (their lengths, read from the part files' heads without the
payload, or the payload itself for writers that must look into it) go through the writer's own
rollover rule (``formats.rollover``), so a writer that starts at a planned boundary cuts exactly
the shards one writer would have cut. A plan lets several writers (gather workers, cluster ranks)
share a split, and lets one writer record each shard it finishes on its own, so the gather gives
back the spill behind it and a killed gather resumes after its finished shards (``release.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import orjson

from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.core.ragged import starts_of
from shardsmith.engine.shuffle import release
from shardsmith.engine.shuffle.buckets import sort_group, sorted_lengths
from shardsmith.engine.shuffle.open_parts import OpenParts
from shardsmith.engine.shuffle.release import released_mark
from shardsmith.engine.shuffle.segments import Segments
from shardsmith.errors import DatasetError
from shardsmith.kit.writer import Writer


@dataclass(frozen=True)
class SplitPlan:
    """Where each shard of a split starts (a sample position), then the split's end; and the
    split's weight (the rollover's units: tokens for token shards) before each of those."""

    bounds: list[int]
    weights: list[int]

    @property
    def shards(self) -> int:
        return len(self.bounds) - 1


class Plannable(Protocol):
    """What planning reads of a split: its groups' starts, sizes and removals, and the rows of the
    groups that hold a boundary (``SplitGather``, or the plan unit's table in the scratch folder)."""

    name: str
    starts: np.ndarray
    drop_bytes: list[int]

    @property
    def samples(self) -> int: ...

    def drop(self, g: int) -> np.ndarray | None: ...

    def group(self, g: int) -> Segments: ...

    def group_payload(self, g: int) -> int: ...


Bring = Callable[[Segments, bool], None]  # the rows' heads (or payloads: True) brought here before they are read


def plan_split(split: Plannable, writer: Writer, work_dir: Path, *, bring: Bring | None = None) -> SplitPlan:
    """The split's shard boundaries under ``writer``'s rollover rule (saved in the scratch folder:
    every rank computes the same one, and later ranks read it)."""
    path = work_dir / f"plan-{split.name}.json"
    if path.is_file():
        try:
            saved = orjson.loads(path.read_bytes())
            return SplitPlan(bounds=saved["bounds"], weights=saved["weights"])
        except (OSError, ValueError, KeyError):
            pass  # torn: compute it again
    if released_mark(work_dir, split.name).exists():  # the heads it would read may be punched out
        raise DatasetError(f"{path}: the plan of split {split.name} is lost and part of its spill already "
                           f"released; remove {work_dir} and run again")
    with OpenParts() as parts:  # each part opened once for the split, not once a group
        plan = _planned(split, writer, parts, bring)
    atomic_write_bytes(path, orjson.dumps({"bounds": plan.bounds, "weights": plan.weights}))
    return plan


def _planned(split: Plannable, writer: Writer, parts: OpenParts, bring: Bring | None) -> SplitPlan:
    """``plan_split``'s boundaries, from the heads of the groups that hold one (only their rows read)."""
    roller = writer.rollover()
    bounds, weights, total = [0], [0], 0
    starts = split.starts.tolist()
    for g, (start, stop) in enumerate(zip(starts[:-1], starts[1:])):
        # a group that fits whole in the shard being filled holds no boundary: its samples' weights one
        # by one are not needed, only their sum (at 10 GB, 8 of 9 groups: ~12 s of reading heads saved)
        kept_bytes = split.group_payload(g) - (split.drop_bytes[g] if split.drop_bytes else 0)
        whole = None if writer.weigh_payload else writer.total_weight(kept_bytes)
        if whole is not None and roller.takes_whole(whole, stop - start):
            total += whole
            continue
        group = split.group(g)
        if bring is not None:
            bring(group, writer.weigh_payload)
        if writer.weigh_payload:
            w = writer.sorted_weights(sort_group(group, parts=parts, drop=split.drop(g)))
        else:
            w = writer.weights(sorted_lengths(group, split.drop(g), parts=parts), None)
        ends = starts_of(w)
        for cut in roller.cut(w):
            bounds.append(start + cut)
            weights.append(total + int(ends[cut]))
        total += int(ends[-1])
    if split.samples:
        bounds.append(split.samples)
        weights.append(total)
    return SplitPlan(bounds=bounds, weights=weights)


def share(first: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """``[first, stop)`` cut into at most ``parts`` contiguous, non-empty, near-equal ranges."""
    n = stop - first
    cuts = [first + n * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def planned(writer: Writer, *, workers: int, world_size: int, released: bool) -> bool:
    """Whether a split's shards are planned: when several writers share them, when a killed run
    released spill (its ranges resume after their finished shards, never from the start), and when
    one writer gives the spill back as it goes (any ``--workers``; the plan costs a read of the
    heads of the groups that hold a boundary). Otherwise one writer goes through the split."""
    return writer.rangeable and (world_size > 1 or workers > 1 or released or release.gives_back(writer))


def one_writer(plan: SplitPlan, writer: Writer, ranges: int, *, world_size: int, released: bool) -> bool:
    """Whether a planned split is still best written by one writer, unplanned: alone on one rank,
    with one shard or nothing to give back (the nanoGPT file is then hashed as it is written)."""
    if world_size > 1 or ranges > 1 or released:
        return False
    return plan.shards <= 1 or not release.gives_back(writer)
