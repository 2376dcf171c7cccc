"""The scatter: read, transform, key and bucket each task's records into its part file.

Runs task by task, in worker processes when ``--workers`` > 1. Each sample's key and split come
from ``keys.place``, so the output depends on the inputs, seed and options only; workers change
nothing but speed. A task whose part file a killed run of the same command finished is not read
again.
"""


from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.batched import batched
from shardsmith.core.faults import crash_point
from shardsmith.core.ragged import starts_of
from shardsmith.core.words import plural
from shardsmith.engine.inputs.files import changed
from shardsmith.engine.inputs.plan import workers_for
from shardsmith.engine.output.resume import die_with_parent
from shardsmith.engine.processes.workers import worker_pool
from shardsmith.engine.shuffle.buckets import bucket_of
from shardsmith.engine.shuffle.doc_facts import TaskFacts, has_facts
from shardsmith.engine.shuffle.partfile import FOOTERS, PartWriter
from shardsmith.errors import DataError, DatasetError
from shardsmith.kit import keys as keymod
from shardsmith.kit.processed import Processed, Processor
from shardsmith.kit.reader import BadRecord, Reader, StreamError, Task, located
from shardsmith.storage import arrival
from shardsmith.text.cleaning import Cleaner


@dataclass(frozen=True)
class ScatterJob:
    """What every worker needs, sent once per worker."""

    reader: Reader
    processor: Processor
    seed: int
    shuffle: bool
    splits: tuple[tuple[str, float], ...]
    on_error: str
    n_buckets: int
    work_dir: str
    batch_records: int = 2048
    flush_bytes: int = 64 << 20  # a task's buffered output beyond which it goes to its part file
    cleaner: Cleaner | None = None  # --dedup, --decontaminate, --provenance: facts per document (engine/shuffle/doc_facts.py)

    @property
    def fact_columns(self) -> tuple[str, ...]:
        return () if self.cleaner is None else self.cleaner.spec.columns()


@dataclass(slots=True)
class TaskResult:
    task: int
    records: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    dropped: int = 0  # records --balance or --decontaminate left out
    removed: list[dict[str, Any]] = field(default_factory=list)  # the documents --decontaminate left out
    rules: dict[str, list[int]] = field(default_factory=dict)  # per rule: [documents, payload units] left out
    stats: dict[str, int] = field(default_factory=dict)  # the processor's counts (``Processed.stats``), summed
    reused: bool = False  # a killed run of the same command finished it: its part file is taken as it is

    def count(self, out: Processed) -> None:
        """A processed batch's records left out on purpose and its counts, added to the task's."""
        self.dropped += out.dropped
        _add_counts(self.stats, out.stats or {})


def summed_stats(results: Sequence[TaskResult]) -> dict[str, int]:
    """The processor's counts of every task, summed (``TaskResult.stats``)."""
    total: dict[str, int] = {}
    for r in results:
        _add_counts(total, r.stats)
    return total


def _add_counts(into: dict[str, int], counts: dict[str, int]) -> None:
    for key, n in counts.items():
        into[key] = into.get(key, 0) + int(n)


def scatter_task(job: ScatterJob, task: Task, *, max_records: int | None = None) -> TaskResult:
    """Read, transform, key and bucket one task's records into its part file."""
    result = TaskResult(task=task.index)
    try:
        arrival.wait_whole(task.files or (task.file,))  # an input still being staged from a URL
    except DataError as exc:
        result.error = {"file": exc.file, "record": None, "reason": exc.reason, "unit": "record", "skippable": False}
        return result
    part = PartWriter(part_path(job.work_dir, task.index), flush_bytes=job.flush_bytes)
    rel, unit = task.file.rel, job.reader.unit_for(task.file)
    facts = None if job.cleaner is None else TaskFacts(cleaner=job.cleaner, reader=job.reader, task=task)
    records = job.reader.read(task)
    if max_records is not None and not job.reader.columnar:
        records = islice(records, max_records)
    try:
        if job.reader.columnar:
            _scatter_chunks(job, task, records, part, result, unit, max_records)
        else:
            _scatter_records(job, task, records, part, result, unit, facts)
    except DataError as exc:  # a file-level problem raised by a reader (a missing column, a corrupt page)
        if job.on_error == "fail":
            result.error = {"file": exc.file, "record": exc.record, "reason": exc.reason, "unit": exc.unit}
            part.abort()
            return result
        at = exc.record if exc.file == rel else None  # where reading broke off, as --on-error fail names it
        result.skipped.append({**located(rel, at, exc.unit), "unread_tail": True,
                               "reason": f"{exc.reason} (the rest of this task is unread)"})
    if result.error is None and (moved := _changed_input(task)) is not None:
        result.error = moved  # not a bad record: the input changed under the run, whatever --on-error says
    if result.error is None:
        if facts is not None:
            facts.write(job.work_dir)
        cleaned = {"removed": result.removed, "rules": result.rules} if result.rules else {}
        part.write({"task": task.index, "plan": _task_id(task), "buckets": job.n_buckets, "records": result.records,
                    "skipped": result.skipped, **({"dropped": result.dropped} if result.dropped else {}), **cleaned,
                    **({"stats": result.stats} if result.stats else {})})
        crash_point(f"scatter:{task.index}")
    else:
        part.abort()
    return result


def _changed_input(task: Task) -> dict[str, Any] | None:
    """The error of a task whose input file changed between the listing and the end of its reading
    (every task of a file checks at its end, so the last one covers the whole reading of the file)."""
    for f in task.files or (task.file,):
        why = changed(f)
        if why is not None:
            return {"file": f.rel, "record": None, "reason": f"{why}; no dataset was written: run the command "
                    f"again once the input is stable", "unit": "record", "skippable": False}
    return None


def _task_id(task: Task) -> list[Any]:
    """What a part file must have been made from to be reused: the task's file and range."""
    return [task.file.rel, task.start, task.stop, task.first_record, len(task.files)]


def finished_task(work_dir: str, task: Task, *, facts: Sequence[str] = (), buckets: int | None = None,
                  index: bool = True) -> TaskResult | None:
    """The result of a task whose part file a previous (killed) run of the same command finished
    (with its ``facts`` columns: ``engine/shuffle/doc_facts.py``) into ``buckets`` key ranges (a part cut into
    others, or whose footer is torn, lying or older (``partfile``), is redone). ``index``: its index
    checked too (the scatter); a gather reads it once, for its tables, and refuses a lying one."""
    path = part_path(work_dir, task.index)
    if not path.is_file() or not has_facts(work_dir, task.index, facts):
        return None
    try:
        footer = FOOTERS.footer(path)
        meta = footer.meta
        if index:
            footer.rows()
    except (OSError, DatasetError):  # a torn, lying or foreign file: redo the task
        return None
    if meta.get("task") != task.index or meta.get("plan") != _task_id(task) or "records" not in meta:
        return None
    if buckets is not None and meta.get("buckets") != buckets:
        return None
    return TaskResult(task=task.index, records=int(meta["records"]), skipped=list(meta.get("skipped", [])),
                      dropped=int(meta.get("dropped", 0)), removed=list(meta.get("removed", [])),
                      rules=dict(meta.get("rules", {})), stats=dict(meta.get("stats", {})), reused=True)


def _scatter_records(job: ScatterJob, task: Task, records: Iterator[tuple[int, Any]], part: PartWriter,
                     result: TaskResult, unit: str, facts: TaskFacts | None = None) -> None:
    rel = task.file.rel
    for batch in batched(records, job.batch_records):
        broken = batch[-1][1] if isinstance(batch[-1][1], StreamError) else None
        if broken is not None:
            batch = batch[:-1]
        result.records += len(batch)
        good = [(r, v) for r, v in batch if not isinstance(v, BadRecord)]
        bad = [(r, v.reason) for r, v in batch if isinstance(v, BadRecord)]
        out = job.processor.process(task, good) if good else None
        if out is not None:
            bad += out.bad
            result.count(out)
        if bad and not _bad_records(job, task, bad, result, unit):
            return
        if out is not None and len(out.records) and job.cleaner is not None:
            out = decontaminated(job.cleaner, job.reader, task, out, result)
        if out is not None and len(out.records):
            _scatter_batch(job, task, out, part, facts)
        if broken is not None:
            if job.on_error == "fail":
                result.error = {"file": rel, "record": None, "reason": broken.reason, "unit": unit}
                return
            result.skipped.append({"file": rel, "record": None, "unread_tail": True, "reason": f"{broken.reason} "
                                   f"(after {plural(result.records, 'record')} of this task; the rest of the file is unread)"})


def _bad_records(job: ScatterJob, task: Task, bad: list[tuple[int, str]], result: TaskResult, unit: str) -> bool:
    """The first bad record becomes the task's error (``--on-error fail``: returns False), or
    every one is listed as skipped, named by file and record."""
    bad = sorted(bad)
    if job.on_error == "fail":
        record, reason = bad[0]
        where, number = job.reader.describe(task, record)
        result.error = {"file": where, "record": number, "reason": reason, "unit": unit}
        return False
    for r, why in bad:
        result.skipped.append({**located(*job.reader.describe(task, r), unit), "reason": why})
    return True


def _scatter_chunks(job: ScatterJob, task: Task, chunks: Iterator[Any], part: PartWriter, result: TaskResult,
                    unit: str, max_records: int | None) -> None:
    """A columnar reader's chunks (many records each, e.g. physics events) through the processor."""
    for chunk in chunks:
        if isinstance(chunk, StreamError):
            if job.on_error == "fail":
                result.error = {"file": task.file.rel, "record": None, "reason": chunk.reason, "unit": unit}
                return
            result.skipped.append({"file": task.file.rel, "record": None, "unread_tail": True,
                                   "reason": f"{chunk.reason} (after {plural(result.records, unit)} of this task; "
                                             f"the rest of it is unread)"})
            return
        if max_records is not None:
            room = max_records - result.records
            if room <= 0:
                return
            if chunk.n > room:
                chunk = job.processor.head(chunk, room)  # type: ignore[attr-defined]
        result.records += chunk.n
        out = job.processor.process_chunk(task, chunk)  # type: ignore[attr-defined]
        result.count(out)
        if out.bad and not _bad_records(job, task, out.bad, result, unit):
            return
        if len(out.records):
            _scatter_batch(job, task, out, part)


def _scatter_batch(job: ScatterJob, task: Task, out: Processed, part: PartWriter, facts: TaskFacts | None = None
                   ) -> None:
    copies = out.copies
    rels, src, file_index = job.reader.identities(task, out.records // copies)
    recs = src * copies + out.records % copies
    # the split follows the source record, so every copy of a record lands in the same split
    split, keys, order = keymod.place(seed=job.seed, shuffle=job.shuffle, splits=job.splits, paths=rels,
                                      records=recs, file_index=file_index, split_records=src)
    bucket = bucket_of(keys, job.n_buckets) if job.shuffle else np.full(len(recs), task.index, dtype=np.int64)
    group = split.astype(np.int64) * (1 << 32) + bucket
    if facts is not None:
        facts.add(out, order=order, group=group)
    byte_lengths = out.byte_lengths()
    if np.all(group == group[0]):
        perm, bounds = np.arange(len(recs)), [0, len(recs)]
    else:
        perm = np.argsort(group, kind="stable")
        sorted_groups = group[perm]
        bounds = [0, *np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1, len(recs)]
    # pieces as they are when they are long (a joined copy costs more than a write per piece),
    # one joined payload when they are short (a Python object per few bytes costs more)
    if out.pieces_in is not None and int(byte_lengths.sum()) >= _PIECES_MIN_BYTES * len(recs):
        pieces, k = out.pieces_in(perm)
        payloads = [pieces[a * k:b * k] for a, b in zip(bounds[:-1], bounds[1:])]
    else:
        payload = out.payload_in(perm, byte_lengths)
        pstarts = starts_of(byte_lengths[perm])
        payloads = [memoryview(payload[pstarts[a]:pstarts[b]]) for a, b in zip(bounds[:-1], bounds[1:])]
    for a, b, chunk in zip(bounds[:-1], bounds[1:], payloads):
        idx = perm[a:b]
        g = int(group[idx[0]])
        s = g >> 32
        part.add(split=s, bucket=g & 0xFFFFFFFF, keys=keys[idx], order=order[idx], lengths=byte_lengths[idx],
                 payload=chunk)


_PIECES_MIN_BYTES = 1024  # mean record bytes from which records go to the part file piece by piece


def part_path(work_dir: str, index: int) -> Path:
    return Path(work_dir) / f"part-{index:06d}.bin"


_JOB: ScatterJob | None = None


def _init_worker(job: ScatterJob) -> None:
    global _JOB
    die_with_parent()
    _JOB = job


def decontaminated(cleaner: Cleaner, reader: Reader, task: Task, out: Processed, result: TaskResult) -> Processed:
    """The batch less the documents that share an n-gram with a benchmark item (``--decontaminate``),
    each counted by benchmark file and listed with the item it matched; its texts normalized first,
    once for every rule that compares them so."""
    out.normalized = cleaner.normalized(out.texts or [])  # once, for every rule that compares it
    hit = cleaner.contaminated(out.texts or [], out.normalized)
    gone = hit >= 0
    if not gone.any():
        return out
    for record, item, n in zip(out.records[gone].tolist(), hit[gone].tolist(), out.lengths[gone].tolist()):
        name, line = cleaner.benchmarks.item(item)
        result.removed.append({**located(*reader.describe(task, record), reader.unit_for(task.file)),
                               "rule": "decontaminate", "benchmark": name, "item": line})
        tally = result.rules.setdefault(f"decontaminate:{name}", [0, 0])
        tally[0] += 1
        tally[1] += int(n)
    result.dropped += int(gone.sum())
    return out.subset(~gone)


def _run_in_worker(task: Task) -> TaskResult:
    assert _JOB is not None
    return scatter_task(_JOB, task)


def run_scatter(job: ScatterJob, tasks: Sequence[Task], *, workers: int, limit: int | None = None,
                progress: Callable[[int], None] | None = None, idle: Callable[[], None] | None = None
                ) -> list[TaskResult]:
    """All tasks, in workers or in this process; the first failure in input order stops the run.

    Tasks whose part files a killed run of the same command finished are not read again. Tasks are
    taken as they come (``plan.Planned`` plans them as their inputs arrive from a URL): a worker
    starts on the first while the next are planned. ``idle``: run in this process once every task
    is handed to the workers (which are forked by then), while they work: e.g. imports the gather
    needs, which its forked workers then inherit instead of each paying for them.
    """
    tick = progress or (lambda n: None)
    if limit is not None:
        return _limited(job, tasks, limit=limit, progress=tick)
    results: dict[int, TaskResult] = {}

    def todo() -> Iterator[Task]:
        for t in tasks:
            if (done := finished_task(job.work_dir, t, facts=job.fact_columns, buckets=job.n_buckets)) is not None:
                results[t.index] = done
                tick(t.nbytes)
            else:
                yield t

    if isinstance(tasks, list) and (workers <= 1 or len(tasks) <= 1):
        for task in todo():
            results[task.index] = _check(scatter_task(job, task))
            tick(task.nbytes)
        return [results[t.index] for t in tasks]
    # tasks still arriving (their inputs downloaded by threads of this process): even one worker is a
    # process of its own, so that the downloads and the work never share one interpreter lock
    with worker_pool(workers_for(tasks, workers), initializer=_init_worker, initargs=(job,),
                     advice="try fewer --workers or a smaller --memory") as pool:
        running: deque[tuple[Task, Future[TaskResult]]] = deque()
        for task in todo():
            running.append((task, pool.submit(_run_in_worker, task)))
            while running and running[0][1].done():  # the first failure in input order, early
                first, future = running.popleft()
                results[first.index] = _check(future.result())
                tick(first.nbytes)
        if idle is not None:
            idle()
        while running:
            first, future = running.popleft()
            results[first.index] = _check(future.result())
            tick(first.nbytes)
    return [results[t.index] for t in tasks]


def _limited(job: ScatterJob, tasks: Sequence[Task], *, limit: int, progress: Callable[[int], None]
             ) -> list[TaskResult]:
    """The first ``limit`` records, in input order, in this process: tasks are planned (and their
    inputs staged) only as far as they are read. A killed run's parts are reused only when it had
    finished every task (the last task of a limited run holds part of its records)."""
    if isinstance(tasks, list):
        done = [r for t in tasks if (r := finished_task(job.work_dir, t, facts=job.fact_columns, buckets=job.n_buckets)) is not None]
        if tasks and len(done) == len(tasks):
            progress(sum(t.nbytes for t in tasks))
            return done
    results: list[TaskResult] = []
    remaining = limit
    for task in tasks:
        if remaining <= 0:
            break
        res = _check(scatter_task(job, task, max_records=remaining))
        results.append(res)
        remaining -= res.records
        progress(task.nbytes)
    return results


def _check(res: TaskResult) -> TaskResult:
    if res.error:  # a bad record (or a file's unreadable rest) that --on-error skip would have skipped
        raise DataError(**{"skippable": True, **res.error})
    return res
