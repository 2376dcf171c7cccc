"""The gather: each split's samples, in shuffle order, into shards, by one writer or by several.

One writer can go through a split alone (``whole``). To share the work between gather workers or
cluster ranks, or to give the spill back as the shards are finished, the shard boundaries are
planned first (``shard_plan.py``). Each writer then takes a contiguous range of shards, starting at
a planned boundary, and cuts exactly the shards one writer would have cut: the bytes never depend
on how many workers or ranks wrote them.

Every writer leaves a *piece* (its shards' records) in the scratch folder; finishing a split reads
the pieces, checks that they cover every shard, and makes the split-wide files (the wids index,
the nanoGPT file). Plans and pieces are plain files, so ranks on different machines share them
through the scratch folder, and a rank rerun finds its finished piece and does nothing.

Gather workers fork under ``gc.freeze()`` and touch only their range's groups, so the parent's
tables stay shared pages.
"""

from __future__ import annotations

import gc
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from shardsmith.core.faults import crash_point
from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.core.progress import Progress
from shardsmith.engine.output.resume import die_with_parent
from shardsmith.engine.shuffle import release as spill_release
from shardsmith.engine.shuffle.buckets import LoadBuffer, sort_group
from shardsmith.engine.shuffle.mapped import PartMaps, map_group
from shardsmith.engine.shuffle.open_parts import OpenParts
from shardsmith.engine.shuffle.pieces import cover, piece_intact, piece_path, rejoin
from shardsmith.engine.shuffle.release import Release, finished, found, released_mark, to_write
from shardsmith.engine.shuffle.segments import Segments
from shardsmith.engine.shuffle.shard_plan import Plannable, SplitPlan, one_writer, plan_split, planned, share
from shardsmith.engine.shuffle.split_gather import SplitGather, SplitOutput
from shardsmith.errors import UsageError
from shardsmith.kit.batches import MappedBatch, SortedBatch
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

MakeWriter = Callable[[str, ShardRange], Writer]
# Brings the bytes of segments into their (sparse) local part files before they are read: their
# heads, or (True) heads and payloads. Set by a rank whose parts are in a bucket (``outstages``);
# called in this process only, before any worker starts.
Fetch = Callable[[Segments, bool], None]
_fetch: list[Fetch] = []


def fetching(fetch: Fetch | None) -> None:
    """Set (None: clear) what brings part files' segments here before the gather reads them."""
    _fetch.clear()
    if fetch is not None:
        _fetch.append(fetch)


def _bring(segments: Segments, payloads: bool) -> None:
    for fetch in _fetch:
        fetch(segments, payloads)


# -- writing a range ----------------------------------------------------------------------------------


def write_range(split: SplitGather, plan: SplitPlan | None, first: int, stop: int, *, make_writer: MakeWriter,
                work_dir: Path, out_dir: Path, parts: OpenParts, tick: Callable[[int], Any] | None = None) -> None:
    """Shards ``[first, stop)`` of a split (``plan`` None: every shard, by one writer), and their
    piece; a range whose piece a previous run of the same command finished is left as it is, and
    so is each shard a killed run finished (recorded on its own as it was finished, with the spill
    only finished shards read given back: ``engine/shuffle/release.py``). ``parts``: the part files,
    read (and punched) through descriptors opened once for the unit (``write_ranges``). ``tick``:
    told the samples of each group as it is sorted and written."""
    if plan is None:
        _write_run(split, None, 0, 0, None, parts=parts, make_writer=make_writer, work_dir=work_dir, out_dir=out_dir,
                   tick=tick)
        return
    if piece_intact(work_dir, out_dir, split.name, first, stop):
        return
    done = finished(work_dir, out_dir, split.name, first, stop)
    release = Release(split=split, starts=split.starts.tolist(), bounds=plan.bounds, first=first, done=done,
                      work_dir=work_dir, enabled=parts.writable, parts=parts)
    for begin, end in to_write(first, done):
        _write_run(split, plan, begin, end, release, parts=parts, make_writer=make_writer, work_dir=work_dir,
                   out_dir=out_dir, tick=tick)


def _write_run(split: SplitGather, plan: SplitPlan | None, first: int, stop: int, release: Release | None, *,
               parts: OpenParts, make_writer: MakeWriter, work_dir: Path, out_dir: Path,
               tick: Callable[[int], Any] | None) -> None:
    """Shards ``[first, stop)`` by one writer (every shard: ``plan`` None), and their piece."""
    whole = plan is None
    weight_before = 0 if plan is None else plan.weights[first]
    a, b = (0, split.samples) if plan is None else (plan.bounds[first], plan.bounds[stop])
    writer = make_writer(split.name, ShardRange(first_shard=first, first_sample=a, weight_before=weight_before,
                                                whole=whole, work_dir=work_dir))
    if release is not None:
        release.writing(first)
    # a mapped part file holds a file descriptor while any batch of it is alive: not for thousands. Its
    # pages stay resident up to two groups' bytes (the group being copied and the one before it; heads
    # and the pages around them included), the memory the reading path spends on one group and its buffer
    maps = (PartMaps(resident=2 * split.max_group_bytes)
            if writer.maps_parts and split.groups and split.part_files <= MAX_MAPPED_PARTS else None)
    into = None if writer.keeps_batches or maps is not None else LoadBuffer()
    starts = split.starts
    # the groups [a, b) lies in, found without touching any other group's objects
    g0, g1 = int(np.searchsorted(starts[1:], a, side="right")), int(np.searchsorted(starts[:-1], b, side="left"))
    # when the spill is given back: the shards' ends inside the range, where the writer is told its shard is full
    ends = set() if plan is None or release is None or not release.enabled else set(plan.bounds[first + 1:stop])
    try:
        batches = 0
        for g in range(g0, g1):
            gs, ge = int(starts[g]), int(starts[g + 1])
            if ge <= a or gs >= b:
                continue
            lo, hi = max(a, gs), min(b, ge)
            group = split.group(g)
            batch: SortedBatch | MappedBatch
            if maps is not None:
                batch = map_group(group, lo - gs, hi - gs, maps=maps, drop=split.drop(g), origins=split.origins)
            else:
                batch = sort_group(group, lo - gs, hi - gs, parts=parts, into=into, drop=split.drop(g),
                                   origins=split.origins)
            for i, j in _pieces(ends, lo, hi):
                if isinstance(batch, MappedBatch):
                    writer.write_mapped(batch.rows(i, j))
                else:
                    writer.write_sorted(batch.rows(i, j))
                if lo + j in ends:
                    writer.shard_full()  # the plan's boundary: closed now, not when the next sample comes
                if release is not None:
                    release.after(writer)
            if tick is not None:
                tick(hi - lo)
            crash_point(f"gather:{split.name}:{batches}")
            batches += 1
        writer.close()
        if release is not None:
            release.after(writer)
    except BaseException:
        abort = getattr(writer, "abort", None)
        if abort is not None:
            abort()
        raise
    made = len(writer.shards)
    if plan is not None:
        want = np.diff(plan.bounds[first:stop + 1]).tolist()
        got = [s.samples for s in writer.shards]
        if got != want:  # a writer whose rollover differs from its plan: a bug, never silently
            raise AssertionError(f"split {split.name}: shards {first}..{stop} planned with {want} samples, "
                                 f"written with {got}")
    piece = {**writer.piece(), "stop": first + made, "whole": whole}
    atomic_write_bytes(piece_path(work_dir, split.name, first, first + made), orjson.dumps(piece))


def _pieces(ends: set[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """The rows of a group's batch (samples ``[lo, hi)`` of the split) handed to the writer at a
    time: all of them, or a piece a shard cut at ``ends``, so that a shard that ends inside a group
    is recorded (and the spill before it punched) then, not after the rest of the group."""
    cuts = [0, *sorted(c - lo for c in ends if lo < c < hi), hi - lo]
    return list(zip(cuts[:-1], cuts[1:]))


MAX_MAPPED_PARTS = 512


# -- in worker processes ---------------------------------------------------------------------------

_STATE: dict[str, Any] = {}


def _init_worker(state: dict[str, Any]) -> None:
    die_with_parent()
    _STATE.update(state)


def _range_in_worker(job: tuple[int, int, int]) -> None:
    s, first, stop = job
    write_range(_STATE["splits"][s], _STATE["plans"][s], first, stop, make_writer=_STATE["make_writer"],
                work_dir=_STATE["work_dir"], out_dir=_STATE["out_dir"], parts=_STATE["parts"])


def write_ranges(splits: list[SplitGather], plans: list[SplitPlan | None], jobs: list[tuple[int, int, int]], *,
                 make_writer: MakeWriter, work_dir: Path, out_dir: Path, workers: int,
                 tick: Callable[[int], Any] | None = None) -> None:
    """``(split, first, stop)`` ranges, in worker processes when there are several; ``tick`` is told
    the samples written (a group at a time here, a range at a time from workers).

    Each part file the ranges read is opened once for all of them (``open_parts.OpenParts``): here,
    before the workers fork, so that they read, and punch out the spill, through the descriptors they
    inherit; for writing too when a range may give its spill back (``release.gives_back``)."""
    punching = spill_release.ENABLED and spill_release.supported() and any(plans[s] is not None for s, _, _ in jobs)
    with OpenParts(writable=punching) as parts:
        if workers <= 1 or len(jobs) <= 1:
            for s, first, stop in jobs:
                write_range(splits[s], plans[s], first, stop, make_writer=make_writer, work_dir=work_dir,
                            out_dir=out_dir, parts=parts, tick=tick)
            return
        from shardsmith.engine.processes.workers import worker_pool

        parts.open_all([path for rows in _job_rows(splits, plans, jobs) for path in rows.files()])
        state = {"splits": splits, "plans": plans, "make_writer": make_writer, "work_dir": work_dir,
                 "out_dir": out_dir, "parts": parts}
        # the parent's objects (the split tables above all) out of the collector's reach while the workers
        # fork: a collection in a worker would otherwise write to every one of them, copying their pages
        gc.freeze()
        try:
            with worker_pool(min(workers, len(jobs)), initializer=_init_worker, initargs=(state,),
                             advice="try fewer --workers or a smaller --memory") as pool:
                running = {pool.submit(_range_in_worker, job): job for job in jobs}
                for done in as_completed(running):
                    done.result()
                    if tick is not None:
                        tick(_job_samples(splits, plans, running[done]))
        finally:
            gc.unfreeze()


def _job_samples(splits: list[SplitGather], plans: list[SplitPlan | None], job: tuple[int, int, int]) -> int:
    plan = plans[job[0]]
    return splits[job[0]].samples if plan is None else plan.bounds[job[2]] - plan.bounds[job[1]]


# -- the stages ------------------------------------------------------------------------------------


class SplitSource(Protocol):
    """A run's splits as the gather reads them: in memory (``Tables``: a local run), or the plan
    unit's files (``split_plans.PlannedRun``: a staged gather unit, which reads only its rows)."""

    @property
    def names(self) -> list[str]: ...

    def starts(self, s: int) -> np.ndarray:
        """Split ``s``'s groups' first samples, then its size."""

    def plan(self, s: int, writer: Writer) -> SplitPlan:
        """Split ``s``'s shard plan under ``writer``'s rollover."""

    def table(self, s: int, g0: int, g1: int) -> SplitGather:
        """Split ``s`` as the gather reads groups ``[g0, g1)`` of it."""


class Tables:
    """The splits' tables in this process (a local run): planned here, the first time, from the
    heads of the groups that hold a boundary (``shard_plan.plan_split``)."""

    def __init__(self, splits: list[SplitGather], work_dir: Path) -> None:
        self.splits, self.work_dir = splits, work_dir

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.splits]

    def starts(self, s: int) -> np.ndarray:
        return self.splits[s].starts

    def plan(self, s: int, writer: Writer) -> SplitPlan:
        return planned_here(self.splits[s], writer, self.work_dir)

    def table(self, s: int, g0: int, g1: int) -> SplitGather:
        return self.splits[s]


def planned_here(split: Plannable, writer: Writer, work_dir: Path) -> SplitPlan:
    """``plan_split``, with the heads (or payloads) of each group it reads brought here first."""
    return plan_split(split, writer, work_dir, bring=_bring if _fetch else None)


def gather(source: SplitSource, *, make_writer: MakeWriter, work_dir: Path, out_dir: Path, workers: int,
           rank: int = 0, world_size: int = 1, progress: Any = None) -> tuple[dict[str, list[int]], int]:
    """This rank's share of every split's shards (all of them on one rank), over ``workers``
    processes; returns the shard range (first, stop) of each split it wrote a part of ([0, -1]:
    every shard, by one writer), and how many of its shards a killed run had finished (reused).
    ``progress`` (``core.progress.Progress``): a bar of the samples sorted into output order and written."""
    plans: list[SplitPlan | None] = []
    jobs: list[tuple[int, int, int]] = []
    names = source.names
    for s, name in enumerate(names):
        probe = make_writer(name, ShardRange())
        # a killed run that released spill: its ranges resume after their finished shards, never from the start
        released = released_mark(work_dir, name).exists()
        if not planned(probe, workers=workers, world_size=world_size, released=released):
            plans.append(None)  # one writer goes through the split: nothing to plan
            if rank == 0:
                jobs.append((s, 0, 0))
            continue
        plan = source.plan(s, probe)
        ranks = share(0, plan.shards, world_size)  # min(shards, world_size) ranges: later ranks have none
        mine = share(*ranks[rank], max(1, workers)) if rank < len(ranks) else []
        if one_writer(plan, probe, len(mine), world_size=world_size, released=released):
            plans.append(None)  # one writer, hashing the nanoGPT file as it goes
            jobs.append((s, 0, 0))
            continue
        plans.append(plan)
        jobs += [(s, a, b) for a, b in mine]
    kept = 0  # shards a killed run finished
    for s, first, stop in jobs:
        if plans[s] is None:
            continue
        done, lost = found(work_dir, out_dir, names[s], first, stop)
        if lost:  # (a run of its own has started afresh already: ``workdir.work_folder``)
            raise UsageError(f"-o {out_dir}: shards of split {names[s]!r} that a killed run finished were "
                             f"removed or changed, and the spill they were made from is given back; start the "
                             f"stages over (remove {out_dir} and {work_dir})")
        kept += done
    splits = _tables(source, plans, jobs)
    if _fetch:
        _bring(Segments.joined(_job_rows(splits, plans, jobs)), True)
    total = sum(_job_samples(splits, plans, job) for job in jobs)
    desc = "gather" if world_size == 1 else f"gather rank {rank}"
    with (progress or Progress(quiet=True)).bar(total=total, desc=desc, unit=" samples") as bar:
        write_ranges(splits, plans, jobs, make_writer=make_writer, work_dir=work_dir, out_dir=out_dir,
                     workers=workers, tick=bar.update)
    mine_by_split: dict[str, list[int]] = {}
    for s, first, stop in jobs:
        name = names[s]
        if plans[s] is None:
            mine_by_split[name] = [0, -1]
        else:
            got = mine_by_split.setdefault(name, [first, stop])
            got[0], got[1] = min(got[0], first), max(got[1], stop)
    return mine_by_split, kept


def _groups(starts: np.ndarray, a: int, b: int) -> tuple[int, int]:
    """The groups samples ``[a, b)`` lie in, found without touching any other group's objects."""
    return int(np.searchsorted(starts[1:], a, side="right")), int(np.searchsorted(starts[:-1], b, side="left"))


def _tables(source: SplitSource, plans: list[SplitPlan | None], jobs: list[tuple[int, int, int]]
            ) -> list[SplitGather]:
    """Each split this rank writes a range of, as far as it reads it: the groups its ranges lie in."""
    spans: dict[int, tuple[int, int]] = {}
    for s, first, stop in jobs:
        plan, starts = plans[s], source.starts(s)
        a, b = (0, int(starts[-1])) if plan is None else (plan.bounds[first], plan.bounds[stop])
        lo, hi = spans.get(s, (a, b))
        spans[s] = (min(lo, a), max(hi, b))
    out: list[Any] = [None] * len(plans)
    for s, (a, b) in spans.items():
        g0, g1 = _groups(source.starts(s), a, b)
        out[s] = source.table(s, g0, max(g0, g1))
    return out


def _job_rows(splits: list[SplitGather], plans: list[SplitPlan | None], jobs: list[tuple[int, int, int]]
              ) -> list[Segments]:
    """The segments each range of ``jobs`` reads: those of the groups its samples lie in."""
    out: list[Segments] = []
    for s, first, stop in jobs:
        split, plan = splits[s], plans[s]
        a, b = (0, split.samples) if plan is None else (plan.bounds[first], plan.bounds[stop])
        g0, g1 = _groups(split.starts, a, b)
        out.append(split.between(g0, max(g0, g1)))
    return out


class SplitSize(Protocol):
    """What finishing a split needs of it."""

    name: str

    @property
    def samples(self) -> int: ...


def finish(splits: Sequence[SplitSize], *, make_writer: MakeWriter, work_dir: Path, out_dir: Path
           ) -> dict[str, SplitOutput]:
    """Every split's shards from the pieces, checked complete, and its split-wide files."""
    chains: dict[str, list[dict[str, Any]]] = {}
    for split in splits:
        chains[split.name] = cover(split.name, split.samples, work_dir, out_dir)
        for stale in (*out_dir.glob(f".{split.name}-*.tmp-*"), *out_dir.glob(f".{split.name}.*.tmp-*")):
            # what killed writers left (a file, or a folder a writer builds before it renames it into place)
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
    outputs: dict[str, SplitOutput] = {}
    for k, split in enumerate(splits):
        chain = chains[split.name]
        writer = make_writer(split.name, ShardRange(whole=False, work_dir=work_dir))
        if not k:  # shards that depend on every split's (parquet's one schema), rewritten before any split finishes
            rejoin(writer, chains, work_dir)
        extras = writer.finish_split(chain)
        outputs[split.name] = SplitOutput(
            shards=[ShardRecord.from_json(s) for p in chain for s in p["shards"]],
            md5s=[m for p in chain for m in p["md5s"]], flat_record=extras.get("flat"), events=extras.get("events"))
    return outputs
