"""Wires reader → transform → keyed shuffle → writer, across worker processes.

Scatter runs task by task (in workers when ``--workers`` > 1): read records, transform a batch at
a time, compute each sample's key and split, and write the task's part file. Gather runs in this
process: split by split, the parts' buckets in key order, into the writer. Output bytes depend on
the inputs, seed and options only; workers change nothing but speed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from itertools import islice
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from shardsmith.core.ragged import starts_of, take_ragged
from shardsmith.engine import interrupt
from shardsmith.engine import keys as keymod
from shardsmith.engine.gather import MakeWriter, SplitGather, SplitOutput, finish, gather
from shardsmith.engine.inputs import changed
from shardsmith.engine.outdir import finish_output, work_path
from shardsmith.engine.resume import crash_point, die_with_parent
from shardsmith.engine.shuffle import PartWriter, bucket_count, bucket_of, read_part_footer, segments_by_split
from shardsmith.engine.splits import assign_splits
from shardsmith.errors import DataError, UsageError, WorkerDied
from shardsmith.sources.base import BadRecord, Reader, StreamError, Task


@dataclass(frozen=True, kw_only=True)
class ConvertingOptions:
    """The options every converting command shares (DESIGN.md)."""

    seed: int = 0
    shuffle: bool = True
    workers: int = 1
    memory: int = 1_000_000_000
    splits: tuple[tuple[str, float], ...] = (("train", 1.0),)
    on_error: str = "fail"
    limit: int | None = None
    quiet: bool = False
    overwrite: bool = False
    # clusters: one stage of the run on rank ``rank`` of ``world_size`` (None: every stage, here)
    stage: str | None = None
    rank: int = 0
    world_size: int = 1

    def idle_rank(self) -> bool:
        """Whether this rank has nothing to do in its stage (finalize is one process: rank 0)."""
        return self.stage == "finalize" and self.rank != 0


@dataclass(slots=True)
class Processed:
    """A transformed batch: the good records' numbers, their payloads back to back, and the bad ones."""

    records: np.ndarray
    lengths: np.ndarray
    payload: np.ndarray | None  # None: built on demand by ``encode_in``
    bad: list[tuple[int, str]] = field(default_factory=list)
    copies: int = 1  # with K copies per record, sample numbers are record * K + copy
    # builds the payload (uint8) with the records straight in a given order, instead of a copy
    # reordering it; ``lengths`` are then bytes
    encode_in: Callable[[np.ndarray], np.ndarray] | None = None

    def byte_lengths(self) -> np.ndarray:
        size = 1 if self.payload is None else self.payload.dtype.itemsize
        return self.lengths.astype(np.int64) * size

    def payload_in(self, order: np.ndarray, byte_lengths: np.ndarray) -> np.ndarray:
        """The records ``order`` back to back, as bytes."""
        if self.encode_in is not None:
            return self.encode_in(order)
        assert self.payload is not None
        return take_ragged(self.payload.view(np.uint8), byte_lengths, order)


class Processor(Protocol):
    """Turns a batch of ``(record number, value)`` into payloads; built lazily in each worker."""

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed: ...


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


@dataclass(slots=True)
class TaskResult:
    task: int
    records: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None


def scatter_task(job: ScatterJob, task: Task, *, max_records: int | None = None) -> TaskResult:
    """Read, transform, key and bucket one task's records into its part file."""
    result = TaskResult(task=task.index)
    part = PartWriter(part_path(job.work_dir, task.index), flush_bytes=job.flush_bytes)
    rel, unit = task.file.rel, job.reader.unit_for(task.file)
    records = job.reader.read(task)
    if max_records is not None and not job.reader.columnar:
        records = islice(records, max_records)
    try:
        if job.reader.columnar:
            _scatter_chunks(job, task, records, part, result, unit, max_records)
        else:
            _scatter_records(job, task, records, part, result, unit)
    except DataError as exc:  # a file-level problem raised by a reader (a missing column, a corrupt page)
        if job.on_error == "fail":
            result.error = {"file": exc.file, "record": exc.record, "reason": exc.reason, "unit": exc.unit}
            part.abort()
            return result
        result.skipped.append({"file": rel, "record": None, "unread_tail": True,
                               "reason": f"{exc.reason} (the rest of this task is unread)"})
    if result.error is None and (moved := _changed_input(task)) is not None:
        result.error = moved  # not a bad record: the input changed under the run, whatever --on-error says
    if result.error is None:
        part.write({"task": task.index, "plan": _task_id(task), "records": result.records,
                    "skipped": result.skipped})
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


def finished_task(work_dir: str, task: Task) -> TaskResult | None:
    """The result of a task whose part file a previous (killed) run of the same command finished."""
    path = part_path(work_dir, task.index)
    if not path.is_file():
        return None
    try:
        meta = read_part_footer(path)["meta"]
    except Exception:  # a torn or foreign file: redo the task
        return None
    if meta.get("task") != task.index or meta.get("plan") != _task_id(task) or "records" not in meta:
        return None
    return TaskResult(task=task.index, records=int(meta["records"]), skipped=list(meta.get("skipped", [])))


def _scatter_records(job: ScatterJob, task: Task, records: Iterator[tuple[int, Any]], part: PartWriter,
                     result: TaskResult, unit: str) -> None:
    rel = task.file.rel
    for batch in _batched(records, job.batch_records):
        broken = batch[-1][1] if isinstance(batch[-1][1], StreamError) else None
        if broken is not None:
            batch = batch[:-1]
        result.records += len(batch)
        good = [(r, v) for r, v in batch if not isinstance(v, BadRecord)]
        bad = [(r, v.reason) for r, v in batch if isinstance(v, BadRecord)]
        out = job.processor.process(task, good) if good else None
        if out is not None:
            bad += out.bad
        if bad and not _bad_records(job, task, bad, result, unit):
            return
        if out is not None and len(out.records):
            _scatter_batch(job, task, out, part)
        if broken is not None:
            if job.on_error == "fail":
                result.error = {"file": rel, "record": None, "reason": broken.reason, "unit": unit}
                return
            result.skipped.append({"file": rel, "record": None, "unread_tail": True, "reason": f"{broken.reason} "
                                   f"(after {result.records} records of this task; the rest of the file is unread)"})


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
        where, number = job.reader.describe(task, r)
        entry = {"file": where, "record": number, "reason": why}
        if number is not None:
            entry[unit] = number + 1
        result.skipped.append(entry)
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
                                   "reason": f"{chunk.reason} (after {result.records} {unit}s of this task; "
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
        if out.bad and not _bad_records(job, task, out.bad, result, unit):
            return
        if len(out.records):
            _scatter_batch(job, task, out, part)


def _scatter_batch(job: ScatterJob, task: Task, out: Processed, part: PartWriter) -> None:
    copies = out.copies
    rels, src, file_index = job.reader.identities(task, out.records // copies)
    recs = src * copies + out.records % copies
    # the split follows the source record, so every copy of a record lands in the same split
    split = assign_splits(keymod.split_draws(rels, src), dict(job.splits))
    order = keymod.input_order(file_index, recs)
    if job.shuffle:
        keys = keymod.shuffle_keys(job.seed, rels, recs)
        bucket = bucket_of(keys, job.n_buckets)
    else:
        keys = order
        bucket = np.full(len(recs), task.index, dtype=np.int64)
    group = split.astype(np.int64) * (1 << 32) + bucket
    byte_lengths = out.byte_lengths()
    if np.all(group == group[0]):
        perm, bounds = np.arange(len(recs)), [0, len(recs)]
    else:
        perm = np.argsort(group, kind="stable")
        sorted_groups = group[perm]
        bounds = [0, *np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1, len(recs)]
    payload = out.payload_in(perm, byte_lengths)
    pstarts = starts_of(byte_lengths[perm])
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx = perm[a:b]
        g = int(group[idx[0]])
        s = g >> 32
        chunk = payload[pstarts[a]:pstarts[b]]
        part.add(split=s, bucket=g & 0xFFFFFFFF, keys=keys[idx], order=order[idx], lengths=byte_lengths[idx],
                 payload=memoryview(chunk))


def _batched(it: Iterator[Any], n: int) -> Iterator[list[Any]]:
    while batch := list(islice(it, n)):
        yield batch


def part_path(work_dir: str, index: int) -> Path:
    return Path(work_dir) / f"part-{index:06d}.bin"


_JOB: ScatterJob | None = None


def _init_worker(job: ScatterJob) -> None:
    global _JOB
    die_with_parent()
    _JOB = job


def _run_in_worker(task: Task) -> TaskResult:
    assert _JOB is not None
    return scatter_task(_JOB, task)


def run_scatter(job: ScatterJob, tasks: list[Task], *, workers: int, limit: int | None = None,
                progress: Callable[[int], None] | None = None) -> list[TaskResult]:
    """All tasks, in workers or in this process; the first failure in input order stops the run.

    Tasks whose part files a killed run of the same command finished are not read again.
    """
    done = {t.index: r for t in tasks if (r := finished_task(job.work_dir, t)) is not None}
    if done and progress:
        progress(sum(t.nbytes for t in tasks if t.index in done))
    if done and (limit is None or len(done) == len(tasks)):
        todo = [t for t in tasks if t.index not in done]
        fresh = run_scatter(job, todo, workers=workers, limit=None, progress=progress) if todo else []
        by_task = {**done, **{r.task: r for r in fresh}}
        return [by_task[t.index] for t in tasks]
    results: list[TaskResult] = []
    if limit is not None or workers <= 1 or len(tasks) <= 1:
        remaining = limit
        for task in tasks:
            if remaining is not None and remaining <= 0:
                break
            res = scatter_task(job, task, max_records=remaining)
            _check(res)
            results.append(res)
            if remaining is not None:
                remaining -= res.records
            if progress:
                progress(task.nbytes)
        return results
    with worker_pool(min(workers, len(tasks)), initializer=_init_worker, initargs=(job,),
                     advice="try fewer --workers or a smaller --memory") as pool:
        for task, res in zip(tasks, pool.map(_run_in_worker, tasks)):
            _check(res)
            results.append(res)
            if progress:
                progress(task.nbytes)
    return results


@contextlib.contextmanager
def worker_pool(workers: int, *, initializer: Callable[..., None], initargs: tuple[Any, ...],
                advice: str) -> Iterator[ProcessPoolExecutor]:
    """Worker processes, forked where there is fork: they start in milliseconds and inherit the
    parent's imports and warmed state (a tokenizer; nothing is pickled). A worker the system kills
    breaks the pool, which ends the run with a message instead of a hang."""
    ctx = get_context("fork" if "fork" in get_all_start_methods() else "spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=initializer, initargs=initargs)
    try:
        yield pool
    except BrokenProcessPool:
        if interrupt.received() is not None:
            raise interrupt.Interrupted(interrupt.received()) from None
        raise WorkerDied(f"a worker process died (killed by the system: out of memory?); no dataset was "
                         f"written; {advice}: the same command resumes from the finished work") from None
    except BaseException:
        # interrupted, or another task failed: stop the workers now instead of waiting for their
        # tasks (a task finishes or leaves only a temporary file; reruns never trust those)
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                process.kill()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _check(res: TaskResult) -> None:
    if res.error:  # a bad record (or a file's unreadable rest) that --on-error skip would have skipped
        raise DataError(**{"skippable": True, **res.error})


def split_tables(job: ScatterJob, results: list[TaskResult], *, budget: int) -> list[SplitGather]:
    """Every split's bucket groups, from the footers of the tasks' part files."""
    parts = [(part_path(job.work_dir, r.task), read_part_footer(part_path(job.work_dir, r.task)))
             for r in results]
    table = segments_by_split(parts, len(job.splits))
    return [SplitGather.of(name, table[s], budget=budget) for s, (name, _) in enumerate(job.splits)]


@dataclass(frozen=True)
class Sizing:
    """How a memory budget is shared out: task size, gather group size, a task's buffer before it spills."""

    chunk_bytes: int
    group_bytes: int
    flush_bytes: int
    record_bytes: int = 1 << 30  # the longest record a reader keeps (readers.base.Reader.limit_records)

    @classmethod
    def of(cls, *, memory: int, workers: int, input_bytes: int) -> Sizing:
        return cls(
            # ~16 tasks for balance across workers; never more than 1/8 of the budget in one task
            chunk_bytes=max(64 << 10, min(64 << 20, memory // 8, max(1 << 20, input_bytes // 16))),
            # about four gather groups are alive at once (read, reordered, being written, queued), and
            # groups stay small so the same buffers are reused (fresh pages cost more than copies here)
            group_bytes=max(16 << 10, min(memory // 6, 64 << 20)),
            flush_bytes=max(16 << 10, memory // (4 * workers)),
            # a record is held a few times over while it is decoded and transformed (a line, its
            # parsed text, its tokens) in each worker at once: an eighth of a worker's share
            record_bytes=max(1 << 20, min(1 << 30, memory // (8 * workers))),
        )


def convert_all(*, opts: ConvertingOptions, out: Path, reader: Reader, processor: Processor, tasks: list[Task],
                sizing: Sizing, estimated_bytes: int, make_writer: MakeWriter, desc: str,
                progress: Any, run: dict[str, str] | None = None) -> Converted:
    """Scatter every task in workers, gather every split into shards (in workers too, each a range
    of shards), and finish the splits, in a scratch folder (resumed from the finished tasks and
    shard ranges of a killed run with the same ``run`` fingerprint). A cluster stage runs its part
    only and returns no splits."""
    if opts.stage is not None and opts.limit is not None:
        raise UsageError("--limit reads input in order in one process; it does not combine with --stage")
    with work_folder(out, run=run, shared=opts.stage is not None) as work:
        job = ScatterJob(reader=reader, processor=processor, seed=opts.seed, shuffle=opts.shuffle,
                         splits=opts.splits, on_error=opts.on_error, work_dir=str(work),
                         flush_bytes=sizing.flush_bytes,
                         n_buckets=bucket_count(estimated_bytes, sizing.group_bytes) if opts.shuffle else 1)
        if opts.stage == "scatter":
            mine = [t for t in tasks if t.index % opts.world_size == opts.rank]
            with progress.bar(total=sum(t.nbytes for t in mine), desc=f"{desc} rank {opts.rank}", unit="B") as bar:
                results = run_scatter(job, mine, workers=opts.workers, progress=bar.update)
            return Converted(results=results, summary=scatter_summary(opts, results))
        if opts.stage is not None:
            results = _scattered(job, tasks)
        else:
            with progress.bar(total=sum(t.nbytes for t in tasks), desc=desc, unit="B") as bar:
                results = run_scatter(job, tasks, workers=opts.workers, limit=opts.limit, progress=bar.update)
        workers = max(1, opts.workers)
        # gather workers each hold a group at a time: share the budget between them; ranks each
        # write 1/W of the shards, and smaller groups spare them reading rows of their neighbours'
        share = workers * (opts.world_size if opts.stage else 1)
        splits = split_tables(job, results, budget=max(16 << 10, sizing.group_bytes // share))
        if opts.stage != "finalize":
            ranges = gather(splits, make_writer=make_writer, work_dir=work, out_dir=out, workers=workers,
                            rank=opts.rank if opts.stage else 0, world_size=opts.world_size if opts.stage else 1)
        if opts.stage == "gather":
            return Converted(results=results, summary={**_stage(opts), "shards": ranges})
        outputs = finish(splits, make_writer=make_writer, work_dir=work, out_dir=out)
    return Converted(results=results, outputs=outputs)


@dataclass(frozen=True)
class Converted:
    """What ``convert_all`` did: every split's shards, or (a cluster stage) a summary of its part."""

    results: list[TaskResult]
    outputs: dict[str, SplitOutput] = field(default_factory=dict)
    summary: dict[str, Any] | None = None


def _stage(opts: ConvertingOptions) -> dict[str, Any]:
    return {"stage": opts.stage, "rank": opts.rank, "world_size": opts.world_size}


def scatter_summary(opts: ConvertingOptions, results: list[TaskResult] | None) -> dict[str, Any]:
    """What a command returns for a stage that writes no manifest."""
    if results is None:
        return {**_stage(opts), "idle": True}
    return {**_stage(opts), "tasks": len(results), "records": sum(r.records for r in results),
            "skipped": sum(len(r.skipped) for r in results)}


def _scattered(job: ScatterJob, tasks: list[Task]) -> list[TaskResult]:
    """Every task's result from the parts the scatter ranks wrote; a missing one names its task."""
    results, missing = [], []
    for t in tasks:
        res = finished_task(job.work_dir, t)
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
    def of(cls, results: list[TaskResult], writers: dict[str, Any], *, copies: int = 1,
           inputs: list[Any], written: int | None = None) -> Tally:
        """``written``: records written, where a sample holds several (events packed into one tar sample).

        When nothing was written the run ends with an error (which releases the output folder:
        ``session``)."""
        every = [s for r in results for s in r.skipped]
        tally = cls(records=sum(r.records for r in results),
                    written=sum(s.samples for w in writers.values() for s in w.shards) if written is None else written,
                    skipped=[s for s in every if not s.get("unread_tail")],
                    unread=[s for s in every if s.get("unread_tail")])
        if tally.written == 0:
            raise DataError(file=", ".join(f.rel for f in inputs[:3]), reason=f"nothing to write ({tally.records} "
                            f"records read, {len(tally.skipped)} skipped, {len(tally.unread)} files broken off)")
        assert tally.written == (tally.records - len(tally.skipped)) * copies, "records lost"
        return tally

    def source(self) -> dict[str, Any]:
        """The manifest's accounting fields."""
        return {"records": self.records, "skipped": {"count": len(self.skipped), "records": self.skipped},
                "unread": self.unread}


@contextlib.contextmanager
def work_folder(out_dir: Path, *, run: dict[str, str] | None = None, shared: bool = False) -> Iterator[Path]:
    """The spill folder beside the output (``outdir.work_path``), removed when the run ends with an
    error or writes its manifest.

    It is kept when the run is killed or interrupted; the next run of the same command (same
    ``run`` fingerprint: options and unchanged inputs) resumes from its finished part files, any
    other run starts afresh.
    """
    work = work_path(out_dir)
    stamp = work / "run.json"
    if shared:  # cluster stages: ranks share the folder, so it is never removed from under another rank
        _claim_shared(work, stamp, run)
        yield work
        return
    same = False
    if run is not None and stamp.is_file():
        with contextlib.suppress(OSError, ValueError):
            same = orjson.loads(stamp.read_bytes()) == run
    if work.exists() and not same:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if run is not None and not same:
        stamp.write_bytes(orjson.dumps(run))
    try:
        yield work
    except BaseException as exc:
        if interrupt.is_interruption(exc) or isinstance(exc, WorkerDied):
            raise  # keep the finished parts: the same command resumes from them
        shutil.rmtree(work, ignore_errors=True)
        finish_output(out_dir)  # a failed run blocks no other command
        raise
    # on success the parts stay until the manifest is written (``outdir.finish_output``): a run
    # killed in between still resumes without reading its inputs again


def _claim_shared(work: Path, stamp: Path, run: dict[str, str] | None) -> None:
    """Join (or create) the scratch folder of a staged run; refuse one that holds another run's parts.

    The stamp is created atomically (a hard link fails if it exists), so ranks starting at the same
    moment agree on it without locks, which cluster filesystems may not have.
    """
    work.mkdir(parents=True, exist_ok=True)
    body = orjson.dumps(run or {})
    tmp = work / f".run.json.tmp-{os.getpid()}-{os.uname().nodename}"
    tmp.write_bytes(body)
    try:
        os.link(tmp, stamp)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    if stamp.read_bytes() != body:
        raise UsageError(f"{work}: holds the parts of a different run (other options or changed inputs); "
                         f"remove that folder to start over")


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

