"""Today's exchange (``engine/shuffle/scatter``, ``shuffle``, ``run``, ``shard_plan``, ``gather``) as the
simulation runs it: the engine's own units on part files whose payloads are holes.

- **scatter** unit ``r`` (simulated: the one unit that is not the engine's own code, since it
  would read and tokenize the input): its tasks (``i % W == r``) in the shared scratch folder
  (``workdir.work_folder``), each checked for a finished part (``scatter.finished_task``), keyed
  by ``kit.keys.place`` and bucketed by ``buckets.bucket_of``, then written as a part file in
  ``partfile.PartWriter``'s layout (per (split, bucket) run: keys, input orders and lengths, then
  the payload), its footer (``partfile.footer_bytes``: index, directory, meta, trailer), renamed into place. The payloads are left as holes,
  and so are the heads of every run but those of the groups the plan reads (``Today(heads=...)``:
  a 4 kB block a run on disk otherwise, ~50 GB at 100 GB of input); the gather reads zeros there.
  ``sim_check.py`` checks these parts against a real scatter's, byte for byte but the payload.
- **plan**: ``engine/shuffle/run.convert_units`` for the ``PlanUnit``, once: its phases ``tables`` (every
  task's footer meta in ``run._scattered``, the group budget, every part's index in
  ``run.split_tables``, each split's tables written for the gather units: ``split_plans.py``) and
  ``plan`` (``shard_plan.plan_split``: the plan from the heads of the groups that hold a shard
  boundary).
- **gather** unit ``r``: ``convert_units`` for a ``GatherUnit``, as a cluster rank runs it, with
  pack-tokens' writer (``formats/tokens/writer.TokensWriter``, ``--shard-tokens``, uint16 ids) whose
  shard files are holes (``sim_meter.HoleFile``: counted, not written or hashed). Its phases:
  ``tables`` (the plan's index, and of each split's plan file its header, its per-group arrays and
  the rows of its own groups: no footer), ``read`` (``gather.write_ranges``: its groups read and
  sorted, each part they read opened once for the unit, the shards cut and recorded, the spill punched
  through the same descriptors).
- **finalize**: ``convert_units`` for the ``FinalizeUnit``: the plan's index and the tasks' results
  (``tables``), then ``gather.finish`` (the pieces of every range); where gather ranks were not run,
  their pieces do not exist and ``finish`` is not run (its figures then come from the fits).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import orjson
from sim_meter import (
    Exchange,
    Law,
    Meter,
    NotRun,
    Paths,
    Row,
    UnitRef,
    count_holes,
    instrument,
    pick_ranks,
    shards_as_holes,
)
from sim_workload import HEAD_BYTES, TOKEN_BYTES, Workload

from shardsmith.core.progress import Progress
from shardsmith.engine.options import ConvertingOptions
from shardsmith.engine.shuffle.buckets import bucket_of
from shardsmith.engine.shuffle.partfile import TRAILER, footer_bytes
from shardsmith.engine.shuffle.run import convert_units
from shardsmith.engine.shuffle.scatter import _task_id, finished_task, part_path
from shardsmith.engine.shuffle.segments import Segments, group_cuts
from shardsmith.engine.shuffle.shard_plan import SplitPlan, share
from shardsmith.engine.shuffle.spilled_tables import ROW, slice_budget, slices_for
from shardsmith.engine.shuffle.split_gather import SplitGather
from shardsmith.engine.shuffle.split_plans import PlannedRun, fingerprint
from shardsmith.engine.shuffle.workdir import work_folder
from shardsmith.engine.units import FinalizeUnit, GatherUnit, PlanUnit
from shardsmith.formats.tokens.writer import TokensWriter
from shardsmith.kit import keys as keymod
from shardsmith.kit.keys import output_order
from shardsmith.kit.reader import Task
from shardsmith.kit.writer import ShardRange, Writer

# ---------------------------------------------------------------- the scatter's part files


@dataclass(frozen=True)
class TaskRuns:
    """A task's documents as the scatter groups them (``scatter._scatter_batch``): sorted by
    (split, bucket), in input order within each, as one array per column, cut into runs (one
    segment of the part file each) at ``starts``; ``records``: the task's record count."""

    split: np.ndarray  # per run
    bucket: np.ndarray  # per run
    starts: np.ndarray  # per run, then the documents' count
    keys: np.ndarray  # per document, in run order
    order: np.ndarray
    lengths: np.ndarray
    records: int

    def __len__(self) -> int:
        return len(self.split)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.starts)

    @property
    def payloads(self) -> np.ndarray:
        """Each run's payload bytes."""
        return np.add.reduceat(self.lengths, self.starts[:-1]) if len(self) else np.zeros(0, np.int64)

    @property
    def offsets(self) -> np.ndarray:
        """Where each run starts in the part: runs back to back, each its heads then its payload."""
        size = HEAD_BYTES * self.counts + self.payloads
        return np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64) if len(self) else size

    def __iter__(self) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
        return (self.run(i) for i in range(len(self)))

    def run(self, i: int) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
        """Run ``i``: split, bucket, keys, input orders, lengths."""
        a, b = int(self.starts[i]), int(self.starts[i + 1])
        return int(self.split[i]), int(self.bucket[i]), self.keys[a:b], self.order[a:b], self.lengths[a:b]


def task_runs(wl: Workload, task: Task) -> TaskRuns:
    """A task's documents as the scatter groups them into runs (``TaskRuns``)."""
    records, lengths = wl.documents(task)
    split, keys, order = keymod.place(seed=wl.seed, shuffle=True, splits=wl.splits, paths=task.file.rel,
                                      records=records, file_index=task.file.index)
    group = split.astype(np.int64) * (1 << 32) + bucket_of(keys, wl.buckets)
    perm = np.argsort(group, kind="stable")
    g = group[perm]
    starts = np.concatenate([[0], np.flatnonzero(g[1:] != g[:-1]) + 1, [len(g)]]).astype(np.int64) if len(g) \
        else np.zeros(1, np.int64)
    first = g[starts[:-1]]
    return TaskRuns(split=first >> 32, bucket=first & 0xFFFFFFFF, starts=starts, keys=keys[perm], order=order[perm],
                    lengths=np.asarray(lengths, dtype=np.int64)[perm], records=len(records))


def footer_of(runs: TaskRuns, meta: dict[str, Any]) -> bytes:
    """The part's footer and trailer (``PartWriter.write``: one index row ``split, bucket, offset,
    count, payload bytes`` per run)."""
    segments = np.column_stack([runs.split, runs.bucket, runs.offsets, runs.counts, runs.payloads]).astype(np.uint64)
    return footer_bytes(segments.reshape(-1, 5), meta, payload_end=int((HEAD_BYTES * runs.counts + runs.payloads).sum()))


def write_part(path: Path, runs: TaskRuns, meta: dict[str, Any], *,
               heads_of: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
               footer_of: Callable[[TaskRuns, dict[str, Any]], bytes] = footer_of) -> dict[str, int]:
    """A part file as ``PartWriter`` writes it (a temporary name, renamed into place), its footer
    and trailer at the end, each run's payload a hole, and its heads (keys, input orders, lengths)
    at their place where ``heads_of(splits, buckets)`` is true of the run (None: every run; else a
    hole too: zeros). Returns the bytes of its heads (written or not), payload and footer; what is
    left as holes is counted as such. ``footer_of``: the part's footer (another exchange's layout)."""
    footer = footer_of(runs, meta)
    tmp = path.with_name(f".{path.name}.tmp-sim-{os.getpid()}")
    offsets, counts = runs.offsets, runs.counts
    heads = int(HEAD_BYTES * counts.sum())
    payload = int(runs.lengths.sum())
    written = 0
    columns = np.stack([runs.keys.astype(np.uint64), runs.order.astype(np.uint64), runs.lengths.astype(np.uint64)])
    chosen = np.arange(len(runs)) if heads_of is None else np.flatnonzero(heads_of(runs.split, runs.bucket))
    with open(tmp, "wb", buffering=0) as fh:
        for i in chosen.tolist():
            a, b = int(runs.starts[i]), int(runs.starts[i + 1])
            os.pwrite(fh.fileno(), memoryview(np.ascontiguousarray(columns[:, a:b])).cast("B"), int(offsets[i]))
            written += HEAD_BYTES * (b - a)
        os.pwrite(fh.fileno(), footer, heads + payload)
    os.replace(tmp, path)
    count_holes(heads - written + payload)
    return {"heads": heads, "payload": payload, "footer": len(footer)}


def task_meta(wl: Workload, task: Task, records: int) -> dict[str, Any]:
    """The footer's ``meta`` of a task (``scatter.scatter_task``): the real scatter's where it was
    recorded (``RecordedWorkload``), else that of a task with nothing skipped."""
    recorded = wl.scatter_meta(task)
    if recorded is not None:
        return recorded
    return {"task": task.index, "plan": _task_id(task), "buckets": wl.buckets, "records": records, "skipped": []}


def make_writer(wl: Workload, out: Path) -> Callable[[str, ShardRange], Writer]:
    """pack-tokens' writer at its defaults (``formats/tokens/format.TokensFormat.writer`` without
    ``--nanogpt``, ``--provenance`` or ``--pack``): uint16 ids, ``--shard-tokens``."""
    return lambda split, part: TokensWriter(out_dir=out, split=split, dtype=np.dtype(np.uint16),
                                            shard_tokens=wl.shard_tokens, part=part)


def reckon(wl: Workload, *, sample: int) -> dict[str, Any]:
    """Every split's plan worked out from all the documents at once, before any part exists: the
    buckets in key order grouped as ``segments.group_cuts`` groups them under the unit's budget, the
    documents in output order (``kit.keys.output_order``) cut by the writer's own rollover
    (``plan_split`` gives the same: a group that fits whole goes in whole, which ``cut`` does too);
    each gather rank's groups (``share`` of the shards) and the part files they touch; the gather
    ranks to measure (``pick_ranks``). Returns per split the plan's bounds and the buckets whose
    heads the scatter writes: those of the groups a bound lies in (which ``plan_split`` reads) and
    of the measured ranks' groups (which their sort and writer read); elsewhere the gather reads
    zeros it never looks at. The gather unit that plans checks that the engine's plan and tables
    agree with this reckoning."""
    writer = make_writer(wl, Path("."))(wl.splits[0][0], ShardRange())
    cols: dict[str, list[np.ndarray]] = {"split": [], "bucket": [], "key": [], "order": [], "length": [], "task": []}
    for task in wl.tasks:
        records, lengths = wl.documents(task)
        split, keys, order = keymod.place(seed=wl.seed, shuffle=True, splits=wl.splits, paths=task.file.rel,
                                          records=records, file_index=task.file.index)
        for name, col in zip(cols, (split, bucket_of(keys, wl.buckets), keys, order, lengths,
                                    np.full(len(keys), task.index, dtype=np.int64))):
            cols[name].append(col)
    every = {name: np.concatenate(col) for name, col in cols.items()}
    del cols
    splits: list[dict[str, Any]] = []
    opened: list[set[int]] = [set() for _ in range(wl.ranks)]  # the part files each rank's ranges read
    for s, (name, _) in enumerate(wl.splits):
        mine = every["split"] == s
        bucket, key, order, length, task = (every[c][mine] for c in ("bucket", "key", "order", "length", "task"))
        count = np.bincount(bucket, minlength=wl.buckets)
        payload = np.bincount(bucket, weights=length, minlength=wl.buckets).astype(np.int64)
        present = np.flatnonzero(count)
        cuts = group_cuts(payload[present] + HEAD_BYTES * count[present], wl.group_budget).tolist()
        grouped = [present[a:b].tolist() for a, b in zip(cuts[:-1], cuts[1:])]
        group_of = np.zeros(wl.buckets, dtype=np.int64)
        for g, ids in enumerate(grouped):
            group_of[ids] = g
        n_tasks = max(1, wl.task_count)
        pair = np.unique(group_of[bucket] * n_tasks + task)  # (group, part file) read, in group order
        pair_group, pair_task = pair // n_tasks, pair % n_tasks
        ranked = output_order(key, order)
        cuts = writer.rollover().cut(writer.weights(length[ranked], None))
        bounds = [0, *cuts, int(mine.sum())]
        starts = np.concatenate([[0], np.cumsum([int(count[ids].sum()) for ids in grouped])]).astype(np.int64)
        plan = SplitPlan(bounds=bounds, weights=[0] * len(bounds))
        ranges = [[groups_of(starts, plan, first, stop) for first, stop in ranges_of(wl, plan, r)]
                  for r in range(wl.ranks)]
        per_rank = [[g for gs in rs for g in gs] for rs in ranges]
        for r, rs in enumerate(ranges):  # a unit opens each part its ranges read once (``OpenParts``)
            for gs in rs:
                if gs:
                    a, b = np.searchsorted(pair_group, [gs[0], gs[-1] + 1])
                    opened[r].update(pair_task[a:b].tolist())
        splits.append({"name": name, "bounds": bounds, "grouped": grouped,
                       "plan_groups": sorted({int(group_of[bucket[ranked[p]]]) for p in cuts}), "per_rank": per_rank})
    pairs = [len(o) for o in opened]
    ranks = pick_ranks(pairs, done={0}, sample=sample)
    out: dict[str, Any] = {"gather_ranks": ranks, "pairs": pairs}
    for sp in splits:
        heads = set(sp["plan_groups"]) | {g for r in [0, *ranks] for g in sp["per_rank"][r]}
        out[sp["name"]] = {"bounds": sp["bounds"], "buckets": sorted(b for g in heads for b in sp["grouped"][g])}
    return out


# ---------------------------------------------------------------- what each gather rank reads, counted


def ranges_of(wl: Workload, plan: SplitPlan | None, rank: int) -> list[tuple[int, int]]:
    """The shard ranges rank ``rank`` writes (``gather.gather``); [(0, 0)] on rank 0: the whole split."""
    if plan is None:
        return [(0, 0)] if rank == 0 else []
    ranks = share(0, plan.shards, wl.ranks)
    return share(*ranks[rank], max(1, wl.workers)) if rank < len(ranks) else []


def groups_of(starts: np.ndarray, plan: SplitPlan | None, first: int, stop: int) -> list[int]:
    """The groups the samples of shards ``[first, stop)`` lie in (``gather._write_run``), from where
    each group starts (``SplitGather.starts``)."""
    a, b = (0, int(starts[-1])) if plan is None else (plan.bounds[first], plan.bounds[stop])
    g0, g1 = int(np.searchsorted(starts[1:], a, side="right")), int(np.searchsorted(starts[:-1], b, side="left"))
    return [g for g in range(g0, g1) if int(starts[g + 1]) > a and int(starts[g]) < b]


def group_counts(groups: list[Segments]) -> dict[str, int]:
    """Opens, heads, payload and documents of groups read by one reader (a gather unit's ranges, the
    planning of a split: each part file they read opened once, ``open_parts.OpenParts``)."""
    return {"pairs": len(np.unique(np.concatenate([g.part for g in groups]))) if groups else 0,
            "heads": sum(HEAD_BYTES * g.samples for g in groups),
            "payload": sum(g.payload_bytes for g in groups),
            "docs": sum(g.samples for g in groups)}


def planned_groups(split: SplitGather, plan: SplitPlan) -> list[int]:
    """The groups whose heads ``plan_split`` reads: each one a shard boundary lies in (one that fits
    whole in the shard being filled is skipped: ``Rollover.takes_whole``)."""
    starts = split.starts
    return sorted({int(np.searchsorted(starts, bound, side="right")) - 1 for bound in plan.bounds[1:-1]})


def punches(split: SplitGather, plan: SplitPlan, first: int, stop: int) -> int:
    """The part files a range would punch to give back its spill (``release.Release``, on a file
    system that punches holes), a part each time a shard is recorded: the groups wholly inside the
    range whose every sample lies in a finished shard. An upper bound of its punches (a part's spans
    wait until they make an eighth of it: ``release.PUNCHES_PER_PART``), through the descriptors the
    range reads with (``open_parts.OpenParts``: no open of its own)."""
    starts = split.starts.tolist()
    at = next((g for g, s in enumerate(starts[:-1]) if s >= plan.bounds[first]), split.groups)
    opened = 0
    for k in range(first, stop):
        last = at
        while last < split.groups and starts[last + 1] <= plan.bounds[k + 1]:
            last += 1
        rows = split.between(at, last)
        opened += len(np.unique(rows.part[rows.count > 0]))
        at = last
    return opened


def window_reach(touches: list[np.ndarray], groups: int, window: float) -> float:
    """The fraction of part files that ``window`` consecutive groups read (one reads a part if it
    has a segment in any of them), from sampled parts (each, the groups it has segments in), over
    every position of the window."""
    w = max(1, min(groups, round(window)))
    reach = []
    for t in touches:
        hit = np.zeros(groups + 1, dtype=np.int64)
        hit[1:][t] = 1
        run = np.cumsum(hit)
        reach.append(float(np.mean(run[w:] - run[:-w] > 0)))
    return float(np.mean(reach)) if reach else 0.0


def spread_reach(touches: list[np.ndarray], groups: int, count: int) -> float:
    """The fraction of part files that ``count`` groups spread evenly over the split read (the
    groups a shard boundary lies in, which the plan reads)."""
    if count <= 0:
        return 0.0
    picked = np.unique(((np.arange(count) + 0.5) * groups / count).astype(np.int64).clip(0, groups - 1))
    return float(np.mean([np.isin(picked, t).any() for t in touches])) if touches else 0.0


def rank_counts(wl: Workload, splits: list[SplitGather], made: list[SplitPlan | None], rank: int) -> dict[str, int]:
    """What rank ``rank``'s ranges read and write, counted from the tables and plans; ``pairs``: the
    part files they read, each opened once for the unit (``gather.write_ranges``)."""
    total = {"pairs": 0, "heads": 0, "payload": 0, "docs": 0, "tokens": 0, "shards": 0, "groups": 0, "ranges": 0,
             "punches": 0, "max_group": 0, "segments": 0}
    opened: set[str] = set()
    for split, plan in zip(splits, made):
        for first, stop in ranges_of(wl, plan, rank):
            groups = groups_of(split.starts, plan, first, stop)
            total["max_group"] = max([total["max_group"], *(int(split.group(g).nbytes.sum()) for g in groups)])
            total["segments"] += sum(len(split.group(g)) for g in groups)
            read = [split.group(g) for g in groups]
            for key, value in group_counts(read).items():
                if key != "pairs":  # (the unit's, over all its ranges: ``opened``)
                    total[key] += value
            opened.update(g.paths[p] for g in read for p in np.unique(g.part).tolist())
            total["groups"] += len(groups)
            total["ranges"] += 1
            total["punches"] += 0 if plan is None else punches(split, plan, first, stop)
            if plan is None:
                total["tokens"] += split.segments.payload_bytes // TOKEN_BYTES
                total["shards"] += 1
            else:
                total["tokens"] += plan.weights[stop] - plan.weights[first]
                total["shards"] += stop - first
    total["pairs"] = len(opened)
    return total


def saved_plan(scratch: Path, split: str) -> SplitPlan | None:
    """A split's plan as the gather saved it (finalize reads no plan of its own but its shard count)."""
    path = scratch / f"plan-{split}.json"
    if not path.is_file():
        return None
    saved = orjson.loads(path.read_bytes())
    return SplitPlan(bounds=saved["bounds"], weights=saved["weights"])


def slice_segments(wl: Workload, segments: float) -> float:
    """The rows of the plan unit's largest slice of its tables (``spilled_tables.slices_for``, the
    engine's rule): all of them while they fit a quarter of --memory, then a fixed share."""
    return segments / slices_for(int(segments), slice_budget(wl.memory), wl.buckets)


def routed_bytes(wl: Workload, segments: float) -> float:
    """The bytes the plan unit writes, then reads, to route its tables' rows to their slices: none
    while the tables are one slice (routed in memory), else every row once."""
    return 0.0 if slices_for(int(segments), slice_budget(wl.memory), wl.buckets) == 1 else ROW.itemsize * segments


# ---------------------------------------------------------------- the exchange


class Today(Exchange):
    """The exchange of shardsmith as it is: a part file per task, every footer read once by the plan
    unit, each gather unit reading its rows of the plan."""

    name: ClassVar[str] = "today"

    def __init__(self, *, heads: str = "plan") -> None:
        # "plan": the scatter writes the heads of the groups the plan and the measured gather
        # units read (elsewhere zeros, which no measured unit looks into); "all": every head (a
        # 4 kB block written per segment: ~50 GB at 100 GB of input)
        self.heads = heads

    rows: ClassVar[tuple[Row, ...]] = (
        Row("scatter", "scatter", note="simulated: the engine's layout and footers, payloads as holes"),
        Row("plan", "plan", note="the plan unit, once: every footer, the tables and plan of every split written"),
        Row("gather", "gather", note="the busiest measured gather unit: its rows of the plan, then its groups"),
        Row("finalize", "finalize", note="its finish (gather.finish: every range's pieces) run where every "
            "gather rank with shards was run, else fitted"),
    )
    laws: ClassVar[tuple[Law, ...]] = (
        Law("scatter", "opens", None, "tasks_per_rank"),
        Law("scatter", "meta_read", None, ""),
        Law("plan", "opens", "tables", "parts"),
        Law("plan", "opens", "plan", "plan_pairs"),
        # every footer; past one slice of the tables, each row routed through a file once (``spilled_tables``)
        Law("plan", "meta_read", "tables", "footer_bytes", exact="routed_bytes"),
        Law("plan", "meta_read", "plan", "plan_pairs", exact="plan_heads"),
        Law("plan", "cpu", "tables", "segments"),
        Law("plan", "cpu", "plan", "plan_pairs"),
        Law("plan", "written", "tables", "segments+groups", exact="routed_bytes"),
        Law("plan", "written", "plan", ""),
        # the most rows it sorts at once (``spilled_tables``: a slice of buckets under --memory / 4)
        Law("plan", "rss", None, "slice_segments"),
        Law("gather", "opens", "tables", ""),
        Law("gather", "opens", "read", "read_pairs"),  # (a range punches through the descriptors it reads with)
        # its rows of the plan (28 B a segment), each split's per-group arrays and its part files' names
        Law("gather", "meta_read", "tables", "read_segments+groups+parts"),
        Law("gather", "meta_read", "read", "read_pairs", exact="read_heads"),
        Law("gather", "cpu", "tables", "read_segments+groups"),
        Law("gather", "cpu", "read", "read_pairs+read_docs"),
        Law("gather", "written", "tables", ""),
        Law("gather", "written", "read", "read_docs+shards", exact="read_output"),
        Law("gather", "rss", None, "read_segments+read_max_group"),
        Law("finalize", "opens", "tables", ""),
        Law("finalize", "opens", "finish", "pieces"),
        Law("finalize", "meta_read", "tables", "parts"),  # the index, and every task's result
        Law("finalize", "meta_read", "finish", "pieces"),
        Law("finalize", "cpu", "tables", "parts"),
        Law("finalize", "cpu", "finish", "pieces"),
        Law("finalize", "written", "tables", ""),
        Law("finalize", "written", "finish", ""),
        Law("finalize", "rss", None, "parts"),
    )

    def prepare(self, wl: Workload, *, sample: int) -> dict[str, Any]:
        return reckon(wl, sample=sample)

    def setup_units(self, wl: Workload) -> list[UnitRef]:
        """Every scatter unit, the plan unit, then gather rank 0 (the first to start)."""
        return [*(UnitRef("scatter", r) for r in range(wl.ranks)), UnitRef("plan"), UnitRef("gather", 0)]

    def run_unit(self, wl: Workload, paths: Paths, unit: UnitRef, meter: Meter, prepared: dict[str, Any],
                 *, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
        if unit.kind == "scatter":
            return self._scatter(wl, paths, unit.rank, meter, prepared)
        if unit.kind in ("plan", "gather", "finalize"):
            return self._engine_unit(wl, paths, unit, meter, prepared, skip=skip)
        raise ValueError(f"today's exchange has no {unit.kind} unit")

    def _scatter(self, wl: Workload, paths: Paths, rank: int, meter: Meter, prepared: dict[str, Any]
                 ) -> dict[str, Any]:
        mine = [t for t in wl.tasks if t.index % wl.ranks == rank]
        names = [name for name, _ in wl.splits]
        read = np.array(sorted(s * (1 << 32) + b for s, name in enumerate(names) for b in prepared[name]["buckets"]),
                        dtype=np.int64)

        def heads_of(split: np.ndarray, bucket: np.ndarray) -> np.ndarray:
            return np.isin(split.astype(np.int64) * (1 << 32) + bucket, read)

        written = {"heads": 0, "payload": 0, "footer": 0, "docs": 0, "segments": 0}
        with meter.phase("scatter"), work_folder(paths.out, run=wl.identity, shared=True) as work:
            for task in mine:
                if finished_task(str(work), task, buckets=wl.buckets) is not None:
                    continue  # a part a killed run finished: reused
                runs = task_runs(wl, task)
                for key, value in write_part(part_path(str(work), task.index), runs,
                                             task_meta(wl, task, runs.records), footer_of=self.footer,
                                             heads_of=None if self.heads == "all" else heads_of).items():
                    written[key] += value
                written["docs"] += len(runs.keys)
                written["segments"] += len(runs)
        return {**written, "tasks_per_rank": len(mine), "docs_per_rank": written["docs"]}

    # the part's footer (``footer_of``) and its bytes in a part file, for an exchange that only changes them
    footer: ClassVar[Callable[[TaskRuns, dict[str, Any]], bytes]] = staticmethod(footer_of)

    @staticmethod
    def footer_bytes(path: Path) -> int:
        """The bytes of a part's footer (index, directory, meta, trailer)."""
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(-TRAILER.size, os.SEEK_END)
            return size - TRAILER.unpack(fh.read(TRAILER.size))[0]

    def engine_as_is(self) -> None:
        """Called in a gather or finalize unit's process before anything is wrapped: where an exchange
        that differs from the engine in one place puts its own code (none for today's)."""

    def _engine_unit(self, wl: Workload, paths: Paths, unit: UnitRef, meter: Meter, prepared: dict[str, Any],
                     *, skip: frozenset[str]) -> dict[str, Any]:
        """The plan unit, a gather unit or finalize: ``engine/shuffle/run.convert_units`` itself, instrumented."""
        self.engine_as_is()
        shards_as_holes()
        captured = instrument(meter, skip=skip, punch_holes=False)
        computes = unit.kind == "plan"
        what = {"plan": PlanUnit(world=wl.ranks), "gather": GatherUnit(rank=unit.rank, world=wl.ranks),
                "finalize": FinalizeUnit()}[unit.kind]
        opts = ConvertingOptions(seed=wl.seed, shuffle=True, workers=wl.workers, memory=wl.memory, splits=wl.splits,
                                 stage=what.stage, rank=unit.rank, world_size=wl.ranks)
        finished = True
        with meter.phase("tables"):
            try:
                convert_units(what, opts=opts, out=paths.out, reader=None, processor=None,  # type: ignore[arg-type]
                              tasks=wl.tasks, sizing=wl.sizing, estimated_bytes=wl.input_bytes,
                              make_writer=make_writer(wl, paths.out), desc=unit.kind, progress=Progress(quiet=True),
                              run=wl.identity)
            except NotRun:
                finished = False
        meter.unit_done()
        # the tables the plan unit wrote (read after the unit, not counted in its phases: the reckoning
        # needs every row; the plan unit holds a slice of them at a time), each split's plan (None: unplanned)
        planned = PlannedRun(work=paths.scratch, fp=fingerprint(wl.identity))
        splits = [planned.split(s).table(0, len(planned.split(s).bounds) - 1) for s in range(len(planned.sizes))]
        made = [planned.split(s).plan for s in range(len(planned.sizes))]
        for split, plan in zip(splits, made):  # the heads written are those this plan read
            if plan is not None and plan.bounds != prepared[split.name]["bounds"]:
                raise AssertionError(f"split {split.name}: the engine planned {plan.shards} shards, the "
                                     f"simulation's own reckoning {len(prepared[split.name]['bounds']) - 1}")
        counts = {**self._table_counts(wl, paths, splits), "finished": finished}
        if unit.kind == "finalize":
            every = [rank_counts(wl, splits, made, r) for r in range(wl.ranks)]
            return {**counts, "pieces": sum(r["shards"] + r["ranges"] for r in every)}
        if unit.kind == "gather":
            mine = rank_counts(wl, splits, made, unit.rank)
            return {**counts, "punch_pairs": captured.punches, **{f"read_{k}": v for k, v in mine.items()},
                    "shards": mine["shards"], "read_output": mine["tokens"] * TOKEN_BYTES}
        plan_groups = [[s.group(g) for g in planned_groups(s, p)] if computes and p is not None else []
                       for s, p in zip(splits, made)]
        planning = {k: sum(c[k] for c in map(group_counts, plan_groups)) for k in ("pairs", "heads", "payload", "docs")}
        every = {"every_rank": [rank_counts(wl, splits, made, r) for r in range(wl.ranks)]} if computes else {}
        if every and [r["pairs"] for r in every["every_rank"]] != prepared["pairs"]:
            raise AssertionError("the gather ranks' reads reckoned before the scatter (which chose the ranks to "
                                 "measure) differ from those of the engine's tables")
        return {**counts, **every, "computed_plan": True, "all_shards": sum(p.shards if p is not None else 1 for p in made),
                **{f"plan_{k}": v for k, v in planning.items()}}

    def _table_counts(self, wl: Workload, paths: Paths, splits: list[SplitGather]) -> dict[str, Any]:
        """The predictors of the tables: parts, segments, footer bytes (from the trailers, after the
        unit: not counted in its phases)."""
        footer = sum(self.footer_bytes(part_path(str(paths.scratch), task.index)) for task in wl.tasks)
        segments = sum(len(s.segments) for s in splits)
        return {"parts": wl.task_count, "segments": segments, "slice_segments": slice_segments(wl, segments),
                "routed_bytes": routed_bytes(wl, segments),
                "footer_bytes": footer, "groups": sum(s.groups for s in splits)}

    def shape(self, wl: Workload, *, sample_tasks: int) -> dict[str, float]:
        """Today's predictors at any size: parts and buckets from the sizing rules; segments, footer
        bytes, documents and tokens per part from the parts of a sample of tasks (the first file's:
        at 64 MiB tasks and 65,536 buckets every part is alike), scaled to the run."""
        tasks = wl.file_tasks(wl.files[0], limit=sample_tasks)
        sampled = [task_runs(wl, task) for task in tasks]
        seg = sum(len(runs) for runs in sampled)
        foot = sum(len(self.footer(runs, task_meta(wl, task, runs.records))) for task, runs in zip(tasks, sampled))
        docs = sum(len(runs.keys) for runs in sampled)
        payload = sum(int(runs.lengths.sum()) for runs in sampled)
        k, parts, ranks = len(tasks), wl.task_count, wl.ranks
        segments, footer_bytes = parts * seg / k, parts * foot / k
        docs_total, payload_total = parts * docs / k, parts * payload / k
        shards = max(1, math.ceil(payload_total / TOKEN_BYTES / wl.shard_tokens))
        bucket_bytes = (payload_total + HEAD_BYTES * docs_total) / wl.buckets
        per_group = max(1, int(wl.group_budget // bucket_bytes))  # ``segments.group_cuts``: buckets while they fit
        groups = -(-wl.buckets // per_group)
        # a part is read by a group when it holds a document of one of the group's buckets
        touches = [np.unique(runs.bucket.astype(np.int64) // per_group) for runs in sampled]
        parts_per_group = parts * float(np.mean([len(t) for t in touches])) / groups
        active = min(ranks, shards)
        # the busiest rank: ``share`` gives a rank at most ceil(shards / W) shards of the plan's (each
        # ``shard_tokens`` but the last), and its range touches one group more than it holds
        busiest_shards = math.ceil(shards / ranks)
        share_of_data = min(1.0, busiest_shards * wl.shard_tokens / (payload_total / TOKEN_BYTES))
        busiest_groups = min(groups, share_of_data * groups + 1)
        # ``release.Release`` punches the groups behind each finished shard: every part they touch, a call each
        punch_pairs = busiest_shards * min(parts, parts_per_group * groups / shards)
        docs_per_group, payload_per_group = docs_total / groups, payload_total / groups
        tasks_per_rank = -(-parts // ranks)
        all_groups = groups + active - 1  # every rank's reads together: a group once, again where two ranges share it
        # a unit opens each part its ranges' groups read once (``OpenParts``): the busiest rank's, every
        # rank's; and the plan's reading of the groups a bound lies in
        read_pairs = parts * window_reach(touches, groups, busiest_groups)
        all_read_pairs = active * parts * window_reach(touches, groups, all_groups / active)
        plan_pairs = parts * spread_reach(touches, groups, shards - 1)
        return {"parts": parts, "buckets": wl.buckets, "segments": segments, "footer_bytes": footer_bytes,
                "slice_segments": slice_segments(wl, segments), "routed_bytes": routed_bytes(wl, segments),
                "docs": docs_total, "payload": payload_total, "tokens": payload_total / TOKEN_BYTES,
                "shards": busiest_shards, "all_shards": shards, "groups": groups, "active_ranks": active,
                "buckets_per_group": per_group, "parts_per_group": parts_per_group, "pieces": shards + active,
                "tasks_per_rank": tasks_per_rank, "docs_per_task": docs / k, "docs_per_rank": tasks_per_rank * docs / k,
                "read_pairs": read_pairs, "read_heads": HEAD_BYTES * busiest_groups * docs_per_group,
                "read_docs": busiest_groups * docs_per_group, "punch_pairs": punch_pairs,
                "read_output": min(payload_total, busiest_shards * wl.shard_tokens * TOKEN_BYTES),
                "read_payload": busiest_groups * payload_per_group,
                "read_segments": busiest_groups * segments / groups,  # its rows of the plan
                "read_max_group": per_group * bucket_bytes,  # the group a reading rank holds (``LoadBuffer``)
                "all_read_pairs": all_read_pairs, "all_read_heads": HEAD_BYTES * all_groups * docs_per_group,
                "all_read_docs": all_groups * docs_per_group, "all_read_payload": all_groups * payload_per_group,
                "all_punch_pairs": shards * min(parts, parts_per_group * groups / shards),
                "all_read_output": payload_total,
                "plan_pairs": plan_pairs, "plan_heads": HEAD_BYTES * (shards - 1) * docs_per_group,
                "plan_docs": (shards - 1) * docs_per_group, "sampled_tasks": k}
