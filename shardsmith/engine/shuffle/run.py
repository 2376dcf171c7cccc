"""A conversion from tasks to finished splits: scatter, gather, finish; and its accounting.

``convert_units`` runs a job's units (``engine/job.py``; all of them in a local run): it scatters
the tasks in workers, gathers every split into shards (in workers too, each a range of shards) and
finishes the splits, in a scratch folder that a killed run with the same fingerprint resumes from.
"""


from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardsmith.core.faults import crash_point
from shardsmith.core.words import plural
from shardsmith.engine.inputs.plan import task_bytes
from shardsmith.engine.options import ConvertingOptions
from shardsmith.engine.shuffle.buckets import bucket_count
from shardsmith.engine.shuffle.doc_facts import OriginIndex
from shardsmith.engine.shuffle.duplicates import Duplicates, find_duplicates
from shardsmith.engine.shuffle.gather import MakeWriter, SplitSource, Tables, finish, gather, planned_here
from shardsmith.engine.shuffle.partfile import FOOTERS
from shardsmith.engine.shuffle.release import pinned_budget
from shardsmith.engine.shuffle.scatter import ScatterJob, TaskResult, finished_task, part_path, run_scatter
from shardsmith.engine.shuffle.segments import split_segments
from shardsmith.engine.shuffle.spilled_tables import planning_folder, slice_budget, spill_tables
from shardsmith.engine.shuffle.split_gather import SplitGather, SplitGroups, SplitOutput
from shardsmith.engine.shuffle.split_plans import (
    PlanFile,
    PlannedRun,
    fingerprint,
    index_path,
    split_path,
    write_index,
)
from shardsmith.engine.shuffle.workdir import work_folder
from shardsmith.engine.units import FinalizeUnit, GatherUnit, PlanUnit, ScatterUnit, Unit
from shardsmith.errors import DataError, UsageError
from shardsmith.kit.processed import Processor
from shardsmith.kit.reader import Reader, Task
from shardsmith.kit.writer import ShardRange
from shardsmith.storage import arrival
from shardsmith.text.cleaning import Cleaner


def split_tables(job: ScatterJob, results: list[TaskResult], *, budget: int, duplicates: Duplicates | None = None,
                 origins: OriginIndex | None = None) -> list[SplitGather]:
    """Every split's bucket groups, from the indexes of the tasks' part files (each read once in
    this process, with the footer the scatter's resume check read: ``partfile.FOOTERS``), less the
    documents a dedup rule removed."""
    table = split_segments([str(part_path(job.work_dir, r.task)) for r in results], len(job.splits))
    FOOTERS.forget()  # (read once per run: nothing reads a footer after the tables)
    return [SplitGather.of(name, table[s], budget=budget, origins=origins,
                           removals=None if duplicates is None else duplicates.removals(s))
            for s, (name, _) in enumerate(job.splits)]


def _cleaned(job: ScatterJob, results: list[TaskResult], *, memory: int
             ) -> tuple[Duplicates | None, OriginIndex | None]:
    """What the gather leaves out (``--dedup``) and where its documents came from (``--provenance``)."""
    spec = None if job.cleaner is None else job.cleaner.spec
    if spec is None:
        return None, None
    tasks = [r.task for r in results]
    dups = find_duplicates(spec, work_dir=job.work_dir, tasks=tasks, memory=memory) if spec.dedup else None
    origins = OriginIndex(work_dir=job.work_dir, tasks=tasks) if spec.provenance else None
    if origins is not None:
        origins.build()
    return dups, origins


def make_plan(job: ScatterJob, results: list[TaskResult], *, work: Path, fp: str, memory: int, budget: int,
              make_writer: MakeWriter) -> dict[str, Any]:
    """The plan unit: every split's tables and shard plan from the footers, read once here, into the
    scratch folder for the gather units and finalize (``split_plans.py``); a rerun after the index
    was written (the plan complete) does nothing, one killed before it plans again. The tables are
    built in a folder of their own a slice of buckets at a time (``spilled_tables.py``): this unit's
    memory follows ``--memory``, not the number of segments."""
    index = index_path(work, fp)
    if index.is_file() and all(split_path(work, fp, name).is_file() for name, _ in job.splits):
        return {"tasks": len(results), "splits": len(job.splits), "segments": None}
    dups, _ = _cleaned(job, results, memory=memory)
    folder = planning_folder(work, fp)
    span = job.n_buckets if job.shuffle else 1 + max((r.task for r in results), default=0)
    tables = spill_tables([str(part_path(job.work_dir, r.task)) for r in results], [name for name, _ in job.splits],
                          folder=folder, budget=slice_budget(memory), span=span)
    crash_point("plan:tables")
    plans = []
    budget = pinned_budget(work, budget)
    for s, table in enumerate(tables):
        with PlanFile(split_path(work, fp, table.name), rows=table.rows, paths=table.paths, tmp_dir=folder) as out:
            table.sort_into(out)
            table.groups = SplitGroups.of(table.runs, budget=budget, removals=None if dups is None else dups.removals(s))
            probe = make_writer(table.name, ShardRange())
            plan = planned_here(table, probe, work) if probe.rangeable else None  # (every split a gather may share)
            out.finish(name=table.name, groups=table.groups, plan=plan)
        plans.append(plan)
        crash_point(f"plan:{table.name}")
    write_index(work, fp, tables, plans, results)
    shutil.rmtree(folder, ignore_errors=True)
    return {"tasks": len(results), "splits": len(tables), "segments": sum(t.rows for t in tables)}


TASKS_PER_RANK = 16  # scatter tasks of a rank, about: enough for its workers to even out their ends


def task_size(*, memory: int, world: int, input_bytes: int) -> int:
    """The input bytes of a scatter task: about ``TASKS_PER_RANK`` tasks a scatter rank (a local
    run is one rank), never more than an eighth of ``--memory`` (what the stager keeps ahead of the
    readers), nor less than 1 MB (64 kB under a tiny budget).

    Why from the ranks, not a fixed size (issue 43): every task writes one part file, and a gather
    reads a segment of most parts for each of its groups. Tasks of a fixed 64 MB made the part files
    grow with the corpus (15,000 at 1 TB), and every gather unit's opens and reads with them. Here
    there are ``16 x ranks`` parts wherever that keeps a task under ``--memory / 8``: a run given the
    memory its share of the corpus calls for has as many parts at 10 TB as at 1 TB. What a kill
    costs grows instead: a rerun redoes each unfinished task whole (one a worker, at most). Not from
    ``--workers``: a local run resumed with other workers finds the tasks (and parts) it had."""
    tasks = TASKS_PER_RANK * max(1, world)
    return max(64 << 10, min(memory // 8, max(1 << 20, input_bytes // tasks)))


@dataclass(frozen=True)
class Sizing:
    """How a memory budget is shared out: task size, gather group size, a task's buffer before it spills."""

    chunk_bytes: int
    group_bytes: int
    flush_bytes: int
    record_bytes: int = 1 << 30  # the longest record a reader keeps (sources.base.Reader.limit_records)

    @classmethod
    def of(cls, *, memory: int, workers: int, input_bytes: int, world: int = 1) -> Sizing:
        return cls(
            chunk_bytes=task_size(memory=memory, world=world, input_bytes=input_bytes),
            # about four gather groups are alive at once (read, reordered, being written, queued), and
            # groups stay small so the same buffers are reused (fresh pages cost more than copies here)
            group_bytes=max(16 << 10, min(memory // 6, 64 << 20)),
            flush_bytes=max(16 << 10, memory // (4 * workers)),
            # a record is held a few times over while it is decoded and transformed (a line, its
            # parsed text, its tokens) in each worker at once: an eighth of a worker's share
            record_bytes=max(1 << 20, min(1 << 30, memory // (8 * workers))),
        )

    def group_budget(self, *, workers: int, world: int) -> int:
        """A gather unit's bucket-group budget: gather workers each hold a group at a time, so the
        budget is shared between them; ranks each write 1/W of the shards, and smaller groups spare
        them reading rows of their neighbours'."""
        return max(16 << 10, self.group_bytes // (max(1, workers) * max(1, world)))


def convert_units(unit: Unit | None, *, opts: ConvertingOptions, out: Path, reader: Reader, processor: Processor,
                  tasks: Sequence[Task], sizing: Sizing, estimated_bytes: int, make_writer: MakeWriter, desc: str,
                  progress: Any, run: dict[str, str] | None = None, cleaner: Cleaner | None = None) -> Converted:
    """One unit of a conversion (``engine/job.py``), or every unit in turn (None: a local run, the
    scatter's results handed to the gather in memory): scatter the tasks in workers, gather every
    split into shards (in workers too, each a range of shards), and finish the splits, in a scratch
    folder (resumed from the finished tasks and shard ranges of a killed run with the same ``run``
    fingerprint). A scatter or gather unit returns a summary of its part, no splits."""
    staged = unit is not None
    if staged and opts.limit is not None:
        raise UsageError("--limit reads input in order in one process; it does not combine with --stage")
    with work_folder(out, run=run, shared=staged) as work:
        job = ScatterJob(reader=reader, processor=processor, seed=opts.seed, shuffle=opts.shuffle,
                         splits=opts.splits, on_error=opts.on_error, work_dir=str(work),
                         flush_bytes=sizing.flush_bytes, cleaner=cleaner,
                         n_buckets=bucket_count(estimated_bytes, sizing.group_bytes) if opts.shuffle else 1)
        if isinstance(unit, ScatterUnit):
            mine = [t for t in tasks if t.index % unit.world == unit.rank]
            arrival.expect(f for t in mine for f in (t.files or (t.file,)))  # inputs from a URL: only these
            with progress.bar(total=sum(t.nbytes for t in mine), desc=f"{desc} rank {unit.rank}", unit="B") as bar:
                results = run_scatter(job, mine, workers=opts.workers, progress=bar.update)
            return Converted(results=results, summary={**scatter_summary(opts, results),
                                                       "bytes": sum(t.nbytes for t in mine)})
        workers = max(1, opts.workers)
        fp = fingerprint(run)
        if isinstance(unit, PlanUnit):
            budget = sizing.group_budget(workers=workers, world=unit.world)
            return Converted(results=[], summary={**_stage(opts), **make_plan(
                job, _scattered(job, tasks), work=work, fp=fp, memory=opts.memory, budget=budget,
                make_writer=make_writer)})
        dups, sizes = None, []  # (sizes: what finishing a split needs of it)
        source: SplitSource
        if staged:  # a gather unit or finalize: the plan unit's files, never the footers
            spec = None if cleaner is None else cleaner.spec
            plan = PlannedRun(work=work, fp=fp, origins=OriginIndex(work_dir=work, tasks=[])
                              if spec is not None and spec.provenance else None)
            results, sizes, source = plan.results() if isinstance(unit, FinalizeUnit) else [], plan.sizes, plan
            if isinstance(unit, FinalizeUnit) and spec is not None and spec.dedup:
                dups = find_duplicates(spec, work_dir=work, tasks=[r.task for r in results], memory=opts.memory)
        else:
            with progress.bar(total=task_bytes(tasks), desc=desc, unit="B") as bar:
                results = run_scatter(job, tasks, workers=opts.workers, limit=opts.limit, progress=bar.update,
                                      idle=lambda: _preload(make_writer, job.splits))
            dups, origins = _cleaned(job, results, memory=opts.memory)
            budget = pinned_budget(work, sizing.group_budget(workers=workers, world=1))
            sizes = split_tables(job, results, budget=budget, duplicates=dups, origins=origins)
            source = Tables(sizes, work)
        kept = 0  # shards a killed run finished
        if not isinstance(unit, FinalizeUnit):
            rank, world = (unit.rank, unit.world) if isinstance(unit, GatherUnit) else (0, 1)
            ranges, kept = gather(source, make_writer=make_writer, work_dir=work, out_dir=out, workers=workers,
                                  rank=rank, world_size=world, progress=progress)
        if isinstance(unit, GatherUnit):
            return Converted(results=results, summary={**_stage(opts), "shards": ranges})
        outputs = finish(sizes, make_writer=make_writer, work_dir=work, out_dir=out)
        line = None if staged else resumed_line(tasks, results, shards=kept,
                                                of=sum(len(o.shards) for o in outputs.values()))
        if line:  # (a cluster's finalize: its parts are all the scatter's, none reused)
            progress.note(line)
    named = {t.file.index: (t.file.rel, reader.unit_for(t.file)) for t in tasks} if cleaner is not None else {}
    return Converted(results=results, outputs=outputs, duplicates=dups, cleaning=cleaner, named=named)


def resumed_line(tasks: Sequence[Task], results: list[TaskResult], *, shards: int, of: int) -> str | None:
    """What a rerun of a killed run took over from it (None: nothing, a fresh run): its finished
    shards and scatter tasks, and the input it did not read again."""
    tasks_kept = sum(r.reused for r in results)
    if not tasks_kept and not shards:
        return None
    unread = sum(t.nbytes for t, r in zip(tasks, results) if r.reused)
    return (f"resumed: {shards:,} of {plural(of, 'shard')} and {tasks_kept:,} of {plural(len(results), 'scatter task')} "
            f"reused from a killed run of this command ({plural(unread, 'input byte')} not read again)")


def _preload(make_writer: MakeWriter, splits: tuple[tuple[str, float], ...]) -> None:
    """What the gather's writers import, imported here while the scatter workers work (the
    gather's forked workers inherit it: h5py took 0.15-0.25 s in each of them)."""
    for name, _ in splits[:1]:
        with contextlib.suppress(Exception):  # only a warm-up: the gather makes its writers again
            make_writer(name, ShardRange()).preload()


@dataclass(frozen=True)
class Converted:
    """What ``convert_units`` did: every split's shards, or (a cluster stage) a summary of its part."""

    results: list[TaskResult]
    outputs: dict[str, SplitOutput] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    duplicates: Duplicates | None = None  # what --dedup removed
    cleaning: Cleaner | None = None  # the run's --dedup, --decontaminate, --provenance
    named: dict[int, tuple[str, str]] = field(default_factory=dict)  # file index -> (path, record unit), cleaning


def _stage(opts: ConvertingOptions) -> dict[str, Any]:
    return {"stage": opts.stage, "rank": opts.rank, "world_size": opts.world_size}


def scatter_summary(opts: ConvertingOptions, results: list[TaskResult] | None) -> dict[str, Any]:
    """What a command returns for a stage that writes no manifest."""
    if results is None:
        return {**_stage(opts), "idle": True}
    return {**_stage(opts), "tasks": len(results), "records": sum(r.records for r in results),
            "skipped": sum(len(r.skipped) for r in results), "dropped": sum(r.dropped for r in results)}


def _scattered(job: ScatterJob, tasks: list[Task]) -> list[TaskResult]:
    """Every task's result from the parts the scatter ranks wrote; a missing one names its task."""
    results, missing = [], []
    for t in tasks:
        res = finished_task(job.work_dir, t, facts=job.fact_columns, buckets=job.n_buckets, index=False)
        if res is None:
            missing.append(t.index)
        else:
            results.append(res)
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
        raise UsageError(f"{len(missing)} of {len(tasks)} scatter tasks are not finished (tasks {shown}; task i "
                         f"belongs to scatter rank i mod W): run those --stage scatter ranks first")
    return results


@dataclass(frozen=True)
class Tally:
    """Records read, written and skipped, checked against each other: nothing is lost silently."""

    records: int
    written: int
    skipped: list[dict[str, Any]]  # bad records
    unread: list[dict[str, Any]]  # files that broke off: their tails were never read

    @classmethod
    def of(cls, results: list[TaskResult], writers: dict[str, Any], *, copies: int = 1, inputs: list[Any],
           written: int | None = None, unread_files: Sequence[dict[str, Any]] = (), duplicates: int = 0) -> Tally:
        """``written``: records written, where a sample holds several (events packed into one tar sample);
        ``unread_files``: inputs left out whole before reading (listed with the files that broke off);
        ``duplicates``: documents ``--dedup`` left out of the gather.

        When nothing was written the run ends with an error (which releases the output folder:
        ``session``)."""
        every = [s for r in results for s in r.skipped]
        tally = cls(records=sum(r.records for r in results),
                    written=sum(s.samples for w in writers.values() for s in w.shards) if written is None else written,
                    skipped=[s for s in every if not s.get("unread_tail")],
                    unread=[*unread_files, *(s for s in every if s.get("unread_tail"))])
        dropped = sum(r.dropped for r in results) + duplicates  # left out by --balance, --decontaminate, --dedup
        if tally.written == 0:
            left_out = f", {dropped:,} left out on purpose (--dedup, --decontaminate, --balance, --too-long)" \
                if dropped else ""
            raise DataError(file=", ".join(f.rel for f in inputs[:3]), reason=f"nothing to write ("
                            f"{plural(tally.records, 'record')} read, {len(tally.skipped):,} skipped{left_out}, "
                            f"{plural(len(tally.unread), 'file')} broken off)")
        assert tally.written == (tally.records - len(tally.skipped) - dropped) * copies, "records lost"
        return tally

    def source(self) -> dict[str, Any]:
        """The manifest's accounting fields."""
        return {"records": self.records, "skipped": {"count": len(self.skipped), "records": self.skipped},
                "unread": self.unread}
