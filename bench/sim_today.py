"""Today's exchange (``engine/scatter``, ``shuffle``, ``run``, ``shard_plan``, ``gather``) as the
simulation runs it: the engine's own code on part files whose payloads are holes.

- **scatter** unit ``r``: its tasks (``i % W == r``), each checked for a finished part
  (``scatter.finished_task``), keyed by ``kit.keys.place`` and bucketed by ``shuffle.bucket_of``,
  then written as a part file: ``shuffle.PartWriter``'s layout (per (split, bucket) run: keys, input
  orders and lengths, then the payload), its JSON footer and trailer, renamed into place; the
  payloads are left as holes (``write_part``: PartWriter has no way to skip them).
- **gather** unit ``r``: what ``engine/run.convert_units`` does for a ``GatherUnit`` up to the
  writer: the shared scratch folder (``workdir.work_folder``), every task's footer
  (``run._scattered``), the group budget (``release.pinned_budget``), every footer again and the
  tables (``run.split_tables``) [phase ``tables``]; each split's plan as ``gather.gather`` makes it
  (``shard_plan.planned``, ``plan_split``, ``share``, ``one_writer``) [phase ``plan``: the first
  rank computes it, reading the heads of the groups that hold a shard boundary; later ranks read
  ``plan-train.json``]; then for its ranges ``release.found`` and the groups they lie in, read and
  sorted by ``shuffle.sort_group`` as ``gather.write_range`` reads them (each part of a group opened
  once; the payload holes read as zeros) [phase ``read``]. The batches go to no writer: the shards'
  token bytes are counted from the plan, and the spill is not punched (``release.Release``, which
  opens each part of the finished groups once more per shard).
- **finalize**: the shared folder, every footer twice and the tables, as ``convert_units`` does
  before ``gather.finish`` (which reads one piece per range and writes the manifest: not run here,
  since no shard is written).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import orjson
from sim_meter import Exchange, Law, Meter, Paths, Row, UnitRef
from sim_workload import HEAD_BYTES, TOKEN_BYTES, Workload

from shardsmith.engine.release import found, pinned_budget
from shardsmith.engine.run import _scattered, split_tables
from shardsmith.engine.scatter import ScatterJob, _task_id, finished_task, part_path
from shardsmith.engine.shard_plan import SplitPlan, one_writer, plan_split, planned, share
from shardsmith.engine.shuffle import _TRAILER, PART_MAGIC, LoadBuffer, bucket_of, groups, sort_group
from shardsmith.engine.split_gather import SplitGather
from shardsmith.engine.workdir import work_folder
from shardsmith.formats.tokens.writer import TokensWriter
from shardsmith.kit import keys as keymod
from shardsmith.kit.batches import Segment
from shardsmith.kit.keys import output_order
from shardsmith.kit.reader import Task
from shardsmith.kit.writer import ShardRange

RUN = {"options": "simulated", "inputs": "synthetic"}  # the run's identity in the shared scratch folder


# ---------------------------------------------------------------- the scatter's part files


def task_runs(wl: Workload, task: Task) -> tuple[list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]], int]:
    """A task's documents as the scatter groups them: per (split, bucket), in that order, the keys,
    input orders and payload lengths of its documents in input order (``scatter._scatter_batch``);
    and the task's record count."""
    records, lengths = wl.documents(task)
    split, keys, order = keymod.place(seed=wl.seed, shuffle=True, splits=wl.splits, paths=task.file.rel,
                                      records=records, file_index=task.file.index)
    group = split.astype(np.int64) * (1 << 32) + bucket_of(keys, wl.buckets)
    perm = np.argsort(group, kind="stable")
    g = group[perm]
    bounds = [0, *(np.flatnonzero(g[1:] != g[:-1]) + 1).tolist(), len(g)]
    runs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx = perm[a:b]
        runs.append((int(g[a]) >> 32, int(g[a]) & 0xFFFFFFFF, keys[idx], order[idx], lengths[idx]))
    return runs, len(records)


def footer_of(runs: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]], meta: dict[str, Any]
              ) -> tuple[bytes, list[int]]:
    """The part's JSON footer (``PartWriter.write``: one segment ``[split, bucket, offset, count,
    payload bytes]`` per run, runs back to back: heads, then payload) and each run's offset."""
    segments, offsets, offset = [], [], 0
    for split, bucket, keys, _, lengths in runs:
        payload = int(lengths.sum())
        segments.append([split, bucket, offset, len(keys), payload])
        offsets.append(offset)
        offset += HEAD_BYTES * len(keys) + payload
    return orjson.dumps({"meta": meta, "segments": segments}), offsets


def write_part(path: Path, runs: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]],
               meta: dict[str, Any], *, heads_of: Callable[[int, int], bool] = lambda split, bucket: True
               ) -> dict[str, int]:
    """A part file as ``PartWriter`` writes it (a temporary name, renamed into place), its footer
    and trailer at the end, each run's payload a hole, and its heads (keys, input orders, lengths)
    at their place where ``heads_of(split, bucket)`` (else a hole too: zeros). Returns the bytes of
    its heads (written or not), payload and footer."""
    footer, offsets = footer_of(runs, meta)
    tmp = path.with_name(f".{path.name}.tmp-sim-{os.getpid()}")
    heads = payload = end = 0
    with open(tmp, "wb", buffering=0) as fh:
        for (split, bucket, keys, order, lengths), at in zip(runs, offsets):
            if heads_of(split, bucket):
                block = np.concatenate([keys.astype(np.uint64), order.astype(np.uint64), lengths.astype(np.uint64)])
                os.pwrite(fh.fileno(), memoryview(block).cast("B"), at)
            heads += HEAD_BYTES * len(keys)
            payload += int(lengths.sum())
            end = at + HEAD_BYTES * len(keys) + int(lengths.sum())
        os.pwrite(fh.fileno(), footer + _TRAILER.pack(len(footer), PART_MAGIC), end)
    os.replace(tmp, path)
    return {"heads": heads, "payload": payload, "footer": len(footer)}


def task_meta(wl: Workload, task: Task, records: int) -> dict[str, Any]:
    """The footer's ``meta`` of a task with nothing skipped (``scatter.scatter_task``)."""
    return {"task": task.index, "plan": _task_id(task), "buckets": wl.buckets, "records": records, "skipped": []}


def where_plans_cut(wl: Workload, writer: TokensWriter) -> dict[str, Any]:
    """Every split's plan worked out from all the documents at once, before any part exists: the
    buckets in key order grouped as ``shuffle.groups`` groups them under the unit's budget, the
    documents in output order (``kit.keys.output_order``) cut by the writer's own rollover
    (``plan_split`` gives the same: a group that fits whole goes in whole, which ``cut`` does too).
    Returns per split the plan's bounds and the buckets of the groups a bound lies in: the groups
    whose heads ``plan_split`` reads, the only heads whose values today's exchange looks at."""
    cols: dict[str, list[np.ndarray]] = {"split": [], "bucket": [], "key": [], "order": [], "length": []}
    for task in wl.tasks:
        records, lengths = wl.documents(task)
        split, keys, order = keymod.place(seed=wl.seed, shuffle=True, splits=wl.splits, paths=task.file.rel,
                                          records=records, file_index=task.file.index)
        for name, col in zip(cols, (split, bucket_of(keys, wl.buckets), keys, order, lengths)):
            cols[name].append(col)
    every = {name: np.concatenate(col) for name, col in cols.items()}
    out: dict[str, Any] = {}
    for s, (name, _) in enumerate(wl.splits):
        mine = every["split"] == s
        bucket, key, order, length = (every[c][mine] for c in ("bucket", "key", "order", "length"))
        count = np.bincount(bucket, minlength=wl.buckets)
        payload = np.bincount(bucket, weights=length, minlength=wl.buckets).astype(np.int64)
        whole = {b: [Segment("all", 0, int(count[b]), int(payload[b]))] for b in np.flatnonzero(count).tolist()}
        grouped = groups(whole, budget=wl.group_budget)
        group_of = np.zeros(wl.buckets, dtype=np.int64)
        for g, (ids, _) in enumerate(grouped):
            group_of[ids] = g
        ranked = output_order(key, order)
        cuts = writer.rollover().cut(writer.weights(length[ranked], None))
        bounds = [0, *cuts, int(mine.sum())]
        cut_groups = {int(group_of[bucket[ranked[p]]]) for p in cuts}
        out[name] = {"bounds": bounds, "buckets": sorted(b for g in cut_groups for b in grouped[g][0])}
    return out


# ---------------------------------------------------------------- the gather's tables and ranges


def scatter_job(wl: Workload, paths: Paths) -> ScatterJob:
    """The job as the exchange sees it: the gather reads its scratch folder, splits and buckets, never
    its reader or processor (None here: the simulation has neither)."""
    return ScatterJob(reader=None, processor=None, seed=wl.seed, shuffle=True, splits=wl.splits,  # type: ignore[arg-type]
                      on_error="fail", n_buckets=wl.buckets, work_dir=str(paths.scratch),
                      flush_bytes=wl.sizing.flush_bytes)


def tables(wl: Workload, paths: Paths) -> list[SplitGather]:
    """What a gather unit and finalize do before anything else (``convert_units``)."""
    with work_folder(paths.out, run=RUN, shared=True) as work:
        job = scatter_job(wl, paths)
        results = _scattered(job, wl.tasks)
        budget = pinned_budget(work, wl.group_budget)
        return split_tables(job, results, budget=budget)


def probe(wl: Workload, paths: Paths, split: str) -> TokensWriter:
    """pack-tokens' writer of a split (``formats/tokens``: uint16 ids, ``--shard-tokens``), as the
    gather makes it to plan; it opens nothing until it is given samples."""
    return TokensWriter(out_dir=paths.out, split=split, dtype=np.dtype(np.uint16), shard_tokens=wl.shard_tokens,
                        part=ShardRange())


def plans(wl: Workload, paths: Paths, splits: list[SplitGather]) -> list[SplitPlan | None]:
    """Each split's plan, as ``gather.gather`` makes or reads it (None: one writer, unplanned)."""
    out: list[SplitPlan | None] = []
    for split in splits:
        writer = probe(wl, paths, split.name)
        if not planned(writer, workers=wl.workers, world_size=wl.ranks, released=False):
            out.append(None)
            continue
        plan = plan_split(split, writer, paths.scratch)
        # rank 0's ranges (the only rank when one writer may take the split: W = 1)
        first = share(*share(0, plan.shards, wl.ranks)[0], max(1, wl.workers))
        out.append(None if one_writer(plan, writer, len(first), world_size=wl.ranks, released=False) else plan)
    return out


def ranges_of(wl: Workload, split: SplitGather, plan: SplitPlan | None, rank: int) -> list[tuple[int, int]]:
    """The shard ranges rank ``rank`` writes (``gather.gather``); [(0, 0)] on rank 0: the whole split."""
    if plan is None:
        return [(0, 0)] if rank == 0 else []
    ranks = share(0, plan.shards, wl.ranks)
    return share(*ranks[rank], max(1, wl.workers)) if rank < len(ranks) else []


def groups_of(split: SplitGather, plan: SplitPlan | None, first: int, stop: int) -> list[int]:
    """The groups the samples of shards ``[first, stop)`` lie in (``gather._write_run``)."""
    a, b = (0, split.samples) if plan is None else (plan.bounds[first], plan.bounds[stop])
    starts = split.starts
    g0, g1 = int(np.searchsorted(starts[1:], a, side="right")), int(np.searchsorted(starts[:-1], b, side="left"))
    return [g for g in range(g0, g1) if int(starts[g + 1]) > a and int(starts[g]) < b]


def read_range(wl: Workload, paths: Paths, split: SplitGather, plan: SplitPlan | None, first: int, stop: int) -> None:
    """Shards ``[first, stop)`` of a split read as ``gather.write_range`` reads them for pack-tokens'
    writer (no mapped parts; a fresh buffer a group unless the writer lets one be reused), each
    group sorted into output order, the batches handed to no writer."""
    writer = probe(wl, paths, split.name)
    assert not writer.maps_parts, "the simulation reads groups as a writer without mapped parts does"
    if plan is not None:
        found(paths.scratch, paths.out, split.name, first, stop)  # what a killed run finished
    a, b = (0, split.samples) if plan is None else (plan.bounds[first], plan.bounds[stop])
    into = None if writer.keeps_batches else LoadBuffer()
    starts = split.starts
    for g in groups_of(split, plan, first, stop):
        gs, ge = int(starts[g]), int(starts[g + 1])
        sort_group(split.groups[g], max(a, gs) - gs, min(b, ge) - gs, into=into, drop=split.drop(g),
                   origins=split.origins)


def group_counts(groups: list[list[Any]]) -> dict[str, int]:
    """Opens (a part once per group: ``_load_group``), heads, payload and documents of these groups."""
    return {"pairs": sum(len({s.path for s in g}) for g in groups),
            "heads": sum(HEAD_BYTES * s.count for g in groups for s in g),
            "payload": sum(s.payload_bytes for g in groups for s in g),
            "docs": sum(s.count for g in groups for s in g)}


def planned_groups(split: SplitGather, plan: SplitPlan) -> list[int]:
    """The groups whose heads ``plan_split`` reads: each one a shard boundary lies in (one that fits
    whole in the shard being filled is skipped: ``Rollover.takes_whole``)."""
    starts = split.starts
    return sorted({int(np.searchsorted(starts, bound, side="right")) - 1 for bound in plan.bounds[1:-1]})


def rank_counts(wl: Workload, splits: list[SplitGather], made: list[SplitPlan | None], rank: int) -> dict[str, int]:
    """What rank ``rank``'s ranges read and write, counted from the tables and plans."""
    total = {"pairs": 0, "heads": 0, "payload": 0, "docs": 0, "tokens": 0, "shards": 0, "groups": 0}
    for split, plan in zip(splits, made):
        for first, stop in ranges_of(wl, split, plan, rank):
            groups = groups_of(split, plan, first, stop)
            for key, value in group_counts([split.groups[g] for g in groups]).items():
                total[key] += value
            total["groups"] += len(groups)
            if plan is None:
                total["tokens"] += sum(s.payload_bytes for g in split.groups for s in g) // TOKEN_BYTES
                total["shards"] += 1
            else:
                total["tokens"] += plan.weights[stop] - plan.weights[first]
                total["shards"] += stop - first
    return total


# ---------------------------------------------------------------- the exchange


class Today(Exchange):
    """The exchange of shardsmith as it is: a part file per task, every footer in every unit."""

    name: ClassVar[str] = "today"

    def __init__(self, *, heads: str = "plan") -> None:
        # "plan": the scatter writes the heads of the groups the plan reads (elsewhere zeros: the
        # gather sorts zeros there, a little faster); "all": every head (a 4 kB page written per
        # segment: ~50 GB at 100 GB of input)
        self.heads = heads

    def prepare(self, wl: Workload) -> dict[str, Any]:
        return where_plans_cut(wl, probe(wl, Paths(out=Path("."), scratch=Path(".")), wl.splits[0][0]))
    rows: ClassVar[tuple[Row, ...]] = (
        Row("scatter", "scatter"),
        Row("plan", "gather", phase="plan", rank=0,
            note="made by the first gather unit (every gather unit that starts before plan-train.json exists)"),
        Row("gather", "gather", note="the busiest measured gather unit that found the plan"),
        Row("finalize", "finalize", note="before gather.finish, which reads a piece per range"),
    )
    laws: ClassVar[tuple[Law, ...]] = (
        Law("scatter", "opens", None, "tasks_per_rank"),
        Law("scatter", "meta_read", None, "tasks_per_rank"),
        Law("scatter", "cpu", None, "docs_per_rank"),
        Law("scatter", "rss", None, ""),
        Law("plan", "opens", "plan", "plan_pairs"),
        Law("plan", "meta_read", "plan", "plan_pairs", exact="plan_heads"),
        Law("plan", "cpu", "plan", "plan_pairs"),
        Law("gather", "opens", "tables", "parts"),
        Law("gather", "opens", "plan", ""),
        Law("gather", "opens", "read", "read_pairs"),
        Law("gather", "meta_read", "tables", "footer_bytes"),
        Law("gather", "meta_read", "plan", "shards"),
        Law("gather", "meta_read", "read", "read_pairs", exact="read_heads"),
        Law("gather", "cpu", "tables", "segments"),
        Law("gather", "cpu", "plan", "shards"),
        Law("gather", "cpu", "read", "read_pairs+read_payload"),
        Law("gather", "rss", None, "segments"),
        Law("finalize", "opens", None, "parts"),
        Law("finalize", "meta_read", None, "footer_bytes"),
        Law("finalize", "cpu", None, "segments"),
        Law("finalize", "rss", None, "segments"),
    )

    def setup_units(self, wl: Workload) -> list[UnitRef]:
        """Every scatter unit, then the gather unit that plans (rank 0, the first to start)."""
        return [*(UnitRef("scatter", r) for r in range(wl.ranks)), UnitRef("gather", 0)]

    def run_unit(self, wl: Workload, paths: Paths, unit: UnitRef, meter: Meter, prepared: dict[str, Any]
                 ) -> dict[str, Any]:
        if unit.kind == "scatter":
            return self._scatter(wl, paths, unit.rank, meter, prepared)
        if unit.kind == "gather":
            return self._gather(wl, paths, unit.rank, meter, prepared)
        if unit.kind == "finalize":
            with meter.phase("tables"):
                splits = tables(wl, paths)
            return self._table_counts(wl, paths, splits)
        raise ValueError(f"today's exchange has no {unit.kind} unit")

    def _scatter(self, wl: Workload, paths: Paths, rank: int, meter: Meter, prepared: dict[str, Any]
                 ) -> dict[str, Any]:
        paths.scratch.mkdir(parents=True, exist_ok=True)
        mine = [t for t in wl.tasks if t.index % wl.ranks == rank]
        names = [name for name, _ in wl.splits]
        read = {(s, b) for s, name in enumerate(names) for b in prepared[name]["buckets"]}

        def heads_of(split: int, bucket: int) -> bool:
            return self.heads == "all" or (split, bucket) in read

        written = {"heads": 0, "payload": 0, "footer": 0, "docs": 0, "segments": 0}
        with meter.phase("scatter"):
            for task in mine:
                if finished_task(str(paths.scratch), task, buckets=wl.buckets) is not None:
                    continue  # a part a killed run finished: reused
                runs, records = task_runs(wl, task)
                for key, value in write_part(part_path(str(paths.scratch), task.index), runs,
                                             task_meta(wl, task, records), heads_of=heads_of).items():
                    written[key] += value
                written["docs"] += records
                written["segments"] += len(runs)
        meter.payload("scatter", written=written["payload"])
        return {**written, "tasks_per_rank": len(mine), "docs_per_rank": written["docs"],
                "docs_per_task": written["docs"] / max(1, len(mine))}

    def _gather(self, wl: Workload, paths: Paths, rank: int, meter: Meter, prepared: dict[str, Any]
                ) -> dict[str, Any]:
        with meter.phase("tables"):
            splits = tables(wl, paths)
        computes = not all((paths.scratch / f"plan-{s.name}.json").is_file() for s in splits)
        with meter.phase("plan"):
            made = plans(wl, paths, splits)
        for split, plan in zip(splits, made):  # the heads written are those this plan read
            if plan is not None and plan.bounds != prepared[split.name]["bounds"]:
                raise AssertionError(f"split {split.name}: the engine planned {plan.shards} shards, the "
                                     f"simulation's own reckoning {len(prepared[split.name]['bounds']) - 1}")
        with meter.phase("read"):
            for split, plan in zip(splits, made):
                for first, stop in ranges_of(wl, split, plan, rank):
                    read_range(wl, paths, split, plan, first, stop)
        mine = rank_counts(wl, splits, made, rank)
        meter.payload("read", read=mine["payload"])
        plan_groups = [[s.groups[g] for g in planned_groups(s, p)] if computes and p is not None else []
                       for s, p in zip(splits, made)]
        planning = group_counts([g for gs in plan_groups for g in gs])
        every = {"every_rank": [rank_counts(wl, splits, made, r) for r in range(wl.ranks)]} if computes else {}
        return {**self._table_counts(wl, paths, splits), "computed_plan": computes, **every,
                "shards": sum(p.shards if p is not None else 1 for p in made),
                **{f"read_{k}": v for k, v in mine.items()},
                **{f"plan_{k}": v for k, v in planning.items()}}

    def _table_counts(self, wl: Workload, paths: Paths, splits: list[SplitGather]) -> dict[str, Any]:
        """The predictors of the tables: parts, segments, footer bytes (from the trailers, after the
        unit: not counted in its phases)."""
        footer = 0
        for task in wl.tasks:
            with open(part_path(str(paths.scratch), task.index), "rb") as fh:
                fh.seek(-_TRAILER.size, os.SEEK_END)
                footer += _TRAILER.unpack(fh.read(_TRAILER.size))[0]
        return {"parts": wl.task_count, "segments": sum(len(g) for s in splits for g in s.groups),
                "footer_bytes": footer, "groups": sum(len(s.groups) for s in splits)}

    def shape(self, wl: Workload, *, sample_tasks: int) -> dict[str, float]:
        """Today's predictors at any size: parts and buckets from the sizing rules; segments, footer
        bytes, documents and tokens per part from the parts of a sample of tasks (the first file's:
        at 64 MiB tasks and 65,536 buckets every part is alike), scaled to the run."""
        tasks = wl.file_tasks(wl.files[0], limit=sample_tasks)
        seg = foot = docs = payload = 0
        hit_sets = []
        for task in tasks:
            runs, n = task_runs(wl, task)
            footer, _ = footer_of(runs, task_meta(wl, task, n))
            seg += len(runs)
            foot += len(footer)
            docs += n
            payload += sum(int(r[4].sum()) for r in runs)
            hit_sets.append(np.array([r[1] for r in runs], dtype=np.int64))
        k, parts, ranks = len(tasks), wl.task_count, wl.ranks
        segments, footer_bytes = parts * seg / k, parts * foot / k
        docs_total, payload_total = parts * docs / k, parts * payload / k
        shards = max(1, math.ceil(payload_total / TOKEN_BYTES / wl.shard_tokens))
        bucket_bytes = (payload_total + HEAD_BYTES * docs_total) / wl.buckets
        per_group = max(1, int(wl.group_budget // bucket_bytes))  # ``shuffle._group``: buckets while they fit
        groups = -(-wl.buckets // per_group)
        # a part is read by a group when it holds a document of one of the group's buckets
        parts_per_group = parts * float(np.mean([len(np.unique(h // per_group)) for h in hit_sets])) / groups
        active = min(ranks, shards)
        # the busiest rank: ``share`` gives a rank at most ceil(shards / W) shards of the plan's (each
        # ``shard_tokens`` but the last), and its range touches one group more than it holds
        share_of_data = min(1.0, math.ceil(shards / ranks) * wl.shard_tokens / (payload_total / TOKEN_BYTES))
        busiest_groups = min(groups, share_of_data * groups + 1)
        docs_per_group, payload_per_group = docs_total / groups, payload_total / groups
        tasks_per_rank = -(-parts // ranks)
        return {"parts": parts, "buckets": wl.buckets, "segments": segments, "footer_bytes": footer_bytes,
                "docs": docs_total, "payload": payload_total, "tokens": payload_total / TOKEN_BYTES,
                "shards": shards, "groups": groups, "active_ranks": active, "buckets_per_group": per_group,
                "parts_per_group": parts_per_group,
                "tasks_per_rank": tasks_per_rank, "docs_per_task": docs / k, "docs_per_rank": tasks_per_rank * docs / k,
                "read_pairs": busiest_groups * parts_per_group, "read_heads": HEAD_BYTES * busiest_groups * docs_per_group,
                "read_payload": busiest_groups * payload_per_group,
                # every rank's reads together: each group once, and one more for each range after the first
                "all_read_pairs": (groups + active - 1) * parts_per_group,
                "all_read_heads": HEAD_BYTES * (groups + active - 1) * docs_per_group,
                "all_read_payload": (groups + active - 1) * payload_per_group,
                "plan_pairs": (shards - 1) * parts_per_group, "plan_heads": HEAD_BYTES * (shards - 1) * docs_per_group,
                "plan_docs": (shards - 1) * docs_per_group, "sampled_tasks": k}
