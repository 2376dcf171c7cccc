"""The units of a job: the pieces the engine hands out, each a plain picklable value that any
process runs with ``engine.conduct.run_unit(job, unit)``. ``--stage``, ``--rank`` and
``--world-size`` name one; a local run runs them all in one process. An executor runs a
``PrepareUnit`` first, which claims the output as a local run does, and a ``PlanUnit`` between the
scatter and the gather, which reads the part files' footers once for every gather unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardsmith.engine.options import ConvertingOptions


@dataclass(frozen=True, kw_only=True)
class PrepareUnit:
    """Claim the output as a local run does (``--overwrite``, the same finished run, a scratch folder
    of another run replaced), and plan the tasks once for the ``world`` scatter ranks (whose number
    sizes the tasks: ``engine/shuffle/run.task_size``)."""

    stage: ClassVar[str] = "prepare"
    world: int = 1


@dataclass(frozen=True, kw_only=True)
class ScatterUnit:
    """Scatter the tasks ``i`` with ``i % world == rank`` into part files in the scratch folder."""

    rank: int
    world: int
    stage: ClassVar[str] = "scatter"


@dataclass(frozen=True, kw_only=True)
class PlanUnit:
    """Read every part file's footer once (all scatter units done) and write each split's tables and
    shard plan for the ``world`` gather units (``engine/shuffle/split_plans.py``): each of them then reads
    only its own rows, and finalize only the index, never every footer."""

    world: int
    stage: ClassVar[str] = "plan"


@dataclass(frozen=True, kw_only=True)
class GatherUnit:
    """Write this rank's range of every split's shards from the part files (the plan unit done)."""

    rank: int
    world: int
    stage: ClassVar[str] = "gather"


@dataclass(frozen=True, kw_only=True)
class FinalizeUnit:
    """Check the shards cover every split, write the split-wide files and commit the manifest."""

    stage: ClassVar[str] = "finalize"


Unit = PrepareUnit | ScatterUnit | PlanUnit | GatherUnit | FinalizeUnit


def phases(world: int) -> list[list[Unit]]:
    """A run in ``world`` ranks: the units of each phase run at once, a phase after the one before."""
    return [[PrepareUnit(world=world)], [ScatterUnit(rank=r, world=world) for r in range(world)], [PlanUnit(world=world)],
            [GatherUnit(rank=r, world=world) for r in range(world)], [FinalizeUnit()]]


def unit_of(opts: ConvertingOptions) -> Unit | None:
    """The unit ``--stage``, ``--rank`` and ``--world-size`` name (None: every unit, here)."""
    if opts.stage is None:
        return None
    if opts.stage == "finalize":
        return FinalizeUnit()
    if opts.stage == "prepare":
        return PrepareUnit(world=opts.world_size)
    if opts.stage == "plan":
        return PlanUnit(world=opts.world_size)
    kind = ScatterUnit if opts.stage == "scatter" else GatherUnit
    return kind(rank=opts.rank, world=opts.world_size)
