"""``shardsmith convert``: any registered source into any registered format that holds its records.

The source comes from ``--from`` or from the inputs' suffixes, the format from ``--to`` and what
the source holds (``registry.format_for``); rows and images become tar samples here, events go
to ``convert_events``. The engine does the rest (``engine.run.convert_all``) and the end of the
run is the engine's too (``engine.finish.commit_dataset``).
"""

from __future__ import annotations

from typing import Any

from shardsmith import registry
from shardsmith.commands.convert_events import run_events
from shardsmith.commands.convert_options import ConvertOptions
from shardsmith.core.input_file import InputFile
from shardsmith.core.memory import keep_freed_memory, no_gc
from shardsmith.core.progress import Progress
from shardsmith.engine import url_inputs
from shardsmith.engine.finish import commit_dataset
from shardsmith.engine.output import output_for
from shardsmith.engine.plan import plan_tasks, wait_to_check
from shardsmith.engine.resume import run_identity
from shardsmith.engine.run import Converted, Sizing, convert_all, scatter_summary
from shardsmith.engine.session import OutputRun
from shardsmith.errors import UsageError
from shardsmith.formats.webdataset.samples import SampleProcessor
from shardsmith.kit.downsample import BalancePlan, BalanceSpec, balance_files
from shardsmith.kit.format import Format, WriteJob
from shardsmith.kit.reader import Reader
from shardsmith.kit.transform import build_transforms
from shardsmith.storage import arrival

__all__ = ["ConvertOptions", "infer_source", "run"]


def infer_source(files: list[InputFile], sources: dict[str, type[Reader]]) -> str:
    """The source from the inputs' suffixes (one kind per conversion); a source whose suffixes another
    claims too (Parquet as events) is never inferred: its plain reading is."""
    variants = {cls.events_variant for cls in sources.values()}
    suffixes = {name: cls.suffixes for name, cls in sources.items() if name not in variants}
    # every path, each ended by a NUL (never part of a path): "x.jsonl.gz\0" holds ".jsonl.gz\0"
    # exactly when the path ends with that suffix -- a few C-speed searches, not a test per file
    paths = ("\0".join([f.path for f in files]) + "\0").lower()
    kinds = {kind for kind, sfx in suffixes.items() if any(s + "\0" in paths for s in sfx)}
    if len(kinds) > 1:
        raise UsageError(f"the inputs hold several kinds ({', '.join(sorted(kinds))}); choose one with --from")
    if not kinds:
        raise UsageError("no input file has a suffix a source reads; choose one with --from")
    return kinds.pop()


def run(opts: ConvertOptions) -> dict[str, Any]:
    """The whole command, holding its output folder (``session``); returns the manifest it wrote."""
    if opts.idle_rank():
        return scatter_summary(opts, None)
    with output_for(opts) as session, url_inputs.staging_for_run():
        return _run(session.localize(opts), session)


def _run(opts: ConvertOptions, session: OutputRun) -> dict[str, Any]:
    sources = registry.loaded("source")
    files: list[InputFile] | None = None
    if opts.source is None:
        with no_gc():
            files = url_inputs.discover_inputs(opts, suffixes=tuple(s for c in sources.values() for s in c.suffixes))
            name = infer_source(files, sources)
    else:
        name = opts.source
    cls = sources.get(name) or registry.get("source", name)
    if cls.events_variant and (cls.wants_events(opts) or not registry.formats_for(option=opts.to, holds=cls.holds)):
        cls = registry.get("source", cls.events_variant)
    fmt = registry.format_for(option=opts.to, holds=cls.holds)
    opts = opts.for_format(fmt, registry.format_options(), holds=cls.holds)
    reader = cls.from_options(opts)
    if files is None:  # (inferred: the listing holds exactly that source's files)
        with no_gc():
            files = url_inputs.discover_inputs(opts, suffixes=reader.suffixes)
    skipped = url_inputs.skipped_inputs(files)  # objects --on-error skip left out while staging
    if cls.holds == "events":
        keep_freed_memory()
        return run_events(opts, reader, fmt, files, Progress(quiet=opts.quiet), session, skipped_inputs=skipped)
    return _samples(opts, reader, fmt, files, session, skipped)


def _samples(opts: ConvertOptions, reader: Reader, fmt: Format, files: list[InputFile],
             session: OutputRun, skipped_inputs: list[dict[str, str]]) -> dict[str, Any]:
    """Rows and images into tar samples."""
    images = reader.holds == "images"
    if opts.provenance:
        raise UsageError("--provenance applies to events (ROOT, Parquet events)")
    if opts.augment and not images:
        raise UsageError("--augment applies to image folders")
    if opts.copies > 1 and not opts.augment:
        raise UsageError("--copies needs --augment (identical copies would only repeat samples)")
    if opts.augment:  # a usage error now, not in a worker
        augmenter = registry.get("transform", "augment").from_spec(opts.augment, opts=opts)
        if opts.copies > 1 and not augmenter.random:
            raise UsageError(f"--copies {opts.copies}: {opts.augment!r} has no random op, so every copy would be "
                             f"the same image")
    transforms = build_transforms(opts.transforms, holds=reader.holds, opts=opts)
    # image bytes that pass through unchanged are referenced by the workers and copied by the writer
    job = WriteJob(opts=opts, out=opts.out, options=opts.format_values(), sources=[f.path for f in files] if images and not opts.augment else None)
    balance: BalancePlan | None = None
    if opts.balance is not None:  # files left out of a class keep their indexes in job.sources
        if not images:
            raise UsageError("--balance applies to image folders (class = folder) and events (,label=FIELD)")
        files, balance = balance_files(files, BalanceSpec.parse(opts.balance), seed=opts.seed)
    fmt.check(job)
    # images unchanged, in one process, stopping at the first bad one: the whole output follows from the listing
    direct = (images and fmt.copies_files and not opts.augment and opts.stage is None and opts.limit is None
              and opts.on_error == "fail")
    with no_gc():
        classes = reader.classes(files) if images else None  # type: ignore[attr-defined]
        wait_to_check(reader, files)  # inputs from a URL that the check reads
        reader.check(files, opts)
        sizing = Sizing.of(memory=opts.memory, workers=opts.workers, input_bytes=sum(f.size for f in files))
        reader.limit_records(sizing.record_bytes)
        run_id = run_identity("convert", opts, files, extra_paths=reader.extra_inputs(opts))
        if (finished := session.claim(run_id, input_bytes=sum(f.size for f in files))) is not None:
            return finished
        if not direct:
            keep_freed_memory()
            tasks = plan_tasks(reader, files, chunk_bytes=sizing.chunk_bytes, stage=opts.stage, out=opts.out,
                               run=run_id)
    progress = Progress(quiet=opts.quiet)
    processor = SampleProcessor(reader=reader, classes=classes, opts=opts, transforms=transforms)
    if direct:
        arrival.wait_whole(files)  # images written in shuffled order: every one staged first
        done = fmt.write_files(job, files, samples=processor, progress=progress)
    else:
        done = convert_all(
            opts=opts, out=opts.out, reader=reader, processor=processor, tasks=tasks, sizing=sizing,
            estimated_bytes=sum(f.size for f in files) * opts.copies, desc="convert", progress=progress, run=run_id,
            make_writer=lambda split, part: fmt.writer(job, split, part))
        if done.summary is not None:
            return done.summary
    return _commit(opts, reader, fmt, job, done, files, session, processor, classes, skipped_inputs, balance)


def _commit(opts: ConvertOptions, reader: Reader, fmt: Format, job: WriteJob, done: Converted,
            files: list[InputFile], session: OutputRun, processor: SampleProcessor,
            classes: list[str] | None, skipped_inputs: list[dict[str, str]],
            balance: BalancePlan | None) -> dict[str, Any]:
    extras: dict[str, Any] = {"copies": opts.copies}
    if balance is not None:
        extras["balance"] = balance.describe()
    if classes is not None:
        extras["classes"] = classes
        extras["max_image_pixels"] = opts.max_image_pixels  # what verify --deep and the loader accept
    if opts.augment:
        extras["augment"] = {**processor.augmenter.describe(), "copies": opts.copies}
    if processor.transforms:
        extras["transforms"] = [t.describe() for t in processor.transforms]
    schema = reader.sample_schema(opts)
    if opts.text_field and reader.holds == "rows":
        schema["txt"] = {"kind": "text", "from": opts.text_field}
    source = {"reader": reader.name, **reader.source_fields(opts),
              "check_images": opts.check_images if reader.holds == "images" else None}
    used = [("source", reader.name), *(("transform", t.name) for t in processor.transforms)]
    if opts.augment:
        used.append(("transform", "augment"))
    return commit_dataset(session, fmt=fmt, job=job, done=done, files=files, source=source, schema=schema,
                          extras=extras, copies=opts.copies, used=tuple(used), skipped_inputs=skipped_inputs)
