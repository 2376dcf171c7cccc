"""The engine runs a job (``engine/job.py``), owning the whole sequence once for every command:
output and lock, discovery, sizing, identity, claim, plan, the units (scatter, gather, finalize, or
the copy of unchanged files), commit and cleanup. The command's own steps (``JobSteps``) come in
between, in the order their docstrings give.

Every process runs the same sequence up to the units: a process running one unit (``run_unit``:
a cluster stage, a distributed engine's worker) needs the job and the output folder only; what an
earlier process worked out once (the plan, a schema, the tokenizer check) it finds in the run's
scratch folder (``engine/inputs/plan.py`` ``cached``).
"""

from __future__ import annotations

from typing import Any

from shardsmith.core.file_listing import staged_only, total_size
from shardsmith.core.memory import keep_freed_memory, no_gc
from shardsmith.core.progress import Progress
from shardsmith.core.urls import is_url
from shardsmith.engine.finish import commit_dataset
from shardsmith.engine.inputs import url_inputs
from shardsmith.engine.inputs.plan import plan_tasks
from shardsmith.engine.job import Job, JobRun, JobSteps
from shardsmith.engine.output.resume import run_identity
from shardsmith.engine.output_for import output_for
from shardsmith.engine.shuffle.run import Converted, Sizing, convert_units, scatter_summary
from shardsmith.engine.shuffle.workdir import work_folder
from shardsmith.engine.units import PrepareUnit, Unit, unit_of
from shardsmith.errors import UsageError
from shardsmith.storage import arrival
from shardsmith.text.cleaning import Cleaner, CleaningSpec


def run_job(job: Job) -> dict[str, Any]:
    """The whole job: every unit in this process, or the one unit its options name (``--stage``);
    returns the manifest (a stage that writes none: a summary of its part)."""
    if job.opts.idle_rank():
        return scatter_summary(job.opts, None)
    unit = unit_of(job.opts)
    return _conduct(job, None) if unit is None else run_unit(job, unit)


def run_unit(job: Job, unit: Unit) -> dict[str, Any]:
    """``unit`` of ``job`` in this process, from the job and the output folder alone (its stage,
    rank and world size are the unit's); returns what ``run_job`` returns for it."""
    if isinstance(unit, PrepareUnit):
        return _prepare(job.for_unit(unit))
    return _conduct(job.for_unit(unit), unit)


def _prepare(job: Job) -> dict[str, Any]:
    """The start of a local run, before an executor's ranks: claim the output folder (``--overwrite``
    removes the old dataset; this very run's finished dataset is returned, its manifest), replace a
    scratch folder another run left, and plan the tasks (the ranks read the plan). A bucket's
    stages claim it as they go (``outstages``): nothing to do here for one."""
    if is_url(str(job.out)):
        return {"stage": "prepare", "rank": 0, "world_size": job.opts.world_size}
    with output_for(job.opts) as session, url_inputs.staging_for_run():
        run, steps = _opened(job, session)
        finished = _claim(run, steps)
        if finished is not None:
            return finished
        with work_folder(run.opts.out, run=run.identity):
            pass  # the same run's parts kept, another run's removed, this run's stamp written
    return {"stage": "prepare", "rank": 0, "world_size": job.opts.world_size, "tasks": len(run.tasks),
            "input_bytes": total_size(run.files or ())}


def _conduct(job: Job, unit: Unit | None) -> dict[str, Any]:
    with output_for(job.opts) as session, url_inputs.staging_for_run():
        run, steps = _opened(job, session)
        finished = _claim(run, steps)
        if finished is not None:
            return finished
        done = _units(run, steps, unit)
        if done.summary is not None:
            return done.summary
        return _commit(run, steps, done)


def _opened(job: Job, session: Any) -> tuple[JobRun, JobSteps]:
    """The run of ``job`` in ``session``: its source and format chosen, its inputs listed, checked."""
    run = JobRun(job=job, opts=session.localize(job.opts), session=session, progress=Progress(quiet=job.opts.quiet))
    steps = job.steps(job=job).open(run)
    files = run.files if run.files is not None else run.discover(run.reader.suffixes)
    run.skipped = url_inputs.skipped_inputs(files)
    steps.check(run)
    run.cleaning = _cleaning(run, steps)
    return run, steps


def _cleaning(run: JobRun, steps: JobSteps) -> CleaningSpec | None:
    """What the run cleans (``JobSteps.cleaning``), the options checked together for every command:
    a rule the command's records cannot take is refused, never ignored; an unreadable benchmark file
    is a one-line error here, not in a worker; what a user should know is said before any work."""
    opts, spec = run.opts, steps.cleaning(run)
    asked = bool(opts.dedup or opts.decontaminate)
    if opts.removed and not asked:
        raise UsageError("--removed lists what --dedup and --decontaminate drop: give one of them")
    if asked and spec is None:
        raise UsageError("--dedup and --decontaminate compare documents of text: pack-tokens, or convert "
                         "--text-field of JSONL or Parquet rows")
    for line in Cleaner(spec=spec).warnings() if spec is not None else ():
        run.progress.warn(line)
    return spec


def _claim(run: JobRun, steps: JobSteps) -> dict[str, Any] | None:
    """Size the run, name it, claim the output folder and plan the tasks; the manifest when this
    very run already finished it."""
    opts, reader, files = run.opts, run.reader, run.files or []
    input_bytes = total_size(files)
    with no_gc():
        run.sizing = Sizing.of(memory=opts.memory, workers=opts.workers, input_bytes=input_bytes,
                               world=opts.world_size)
        reader.limit_records(run.sizing.record_bytes)
        run.identity = run_identity(run.job.command, opts, files, extra_paths=steps.extra_inputs(run))
        if (finished := run.session.claim(run.identity, input_bytes=input_bytes)) is not None:
            return finished
        run.copying = (run.fmt.copies_files and steps.copies_files(run) and opts.stage is None
                       and opts.limit is None and opts.on_error == "fail")
        if not run.copying:
            keep_freed_memory()
            run.files = files = list(files)  # the tasks hold their files: a listing on disk is read whole here
            run.tasks = plan_tasks(reader, files, chunk_bytes=run.sizing.chunk_bytes, stage=opts.stage,
                                   out=opts.out, run=run.identity)
    return None


def _units(run: JobRun, steps: JobSteps, unit: Unit | None) -> Converted:
    """The job's units here (``unit``, or all of them), or the copy of unchanged files."""
    processor = steps.processor(run)
    fmt, write, opts = run.fmt, run.write, run.opts
    cleaning = run.cleaning
    assert write is not None and run.sizing is not None, "the steps make the write job before the units"
    if run.copying:
        from shardsmith.engine.copying.image_copy import copy_files

        arrival.wait_whole(staged_only(run.files or ()))  # images written in shuffled order: every one staged first
        return copy_files(run.files or [], copier=fmt.file_copier(write), images=processor,  # type: ignore[arg-type]
                          seed=opts.seed, shuffle=opts.shuffle, splits=opts.splits, workers=opts.workers,
                          out_dir=opts.out, progress=run.progress)
    return convert_units(unit, opts=opts, out=opts.out, reader=run.reader, processor=processor, tasks=run.tasks,
                         sizing=run.sizing, estimated_bytes=steps.estimated_bytes(run), desc=steps.desc,
                         progress=run.progress, run=run.identity,
                         cleaner=None if cleaning is None else Cleaner(spec=cleaning),
                         make_writer=lambda split, part: fmt.writer(write, split, part))


def _commit(run: JobRun, steps: JobSteps, done: Converted) -> dict[str, Any]:
    """The manifest, with what the command adds (``JobSteps.describe``), committed."""
    d = steps.describe(run, done)
    assert run.write is not None
    return commit_dataset(run.session, fmt=run.fmt, job=run.write, done=done, files=run.files or [], source=d.source,
                          schema=d.schema, extras=d.extras, copies=d.copies, events=d.events, used=d.used,
                          unread=d.unread, skipped_inputs=run.skipped, written=d.written, list_inputs=d.list_inputs)
