"""``shardsmith convert``: any registered source into any registered format that holds its records.

The command describes its job (``engine.job.Job``) and the engine runs it (``engine.conduct``).
The source comes from ``--from`` or from the inputs' suffixes, the format from ``--to`` and what the
source holds (``engine.choose``); then the steps of the record kind the source holds carry on
(``RecordKind.convert_steps``): rows and images become neutral samples that the format encodes
(``Format.encoder``), with the steps here; events take those of ``convert_events``, a plugin's kind
its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from shardsmith import registry
from shardsmith.commands.convert_options import ConvertOptions
from shardsmith.core.file_listing import paths_of
from shardsmith.core.memory import no_gc
from shardsmith.engine import Converted, Described, Job, JobRun, JobSteps, run_job
from shardsmith.engine.choose import source_and_format
from shardsmith.engine.inputs.plan import cached, wait_to_check
from shardsmith.errors import UsageError
from shardsmith.executors.base import Executor
from shardsmith.kit.downsample import BalancePlan, BalanceSpec, balance_files
from shardsmith.kit.image_processor import ImageProcessor
from shardsmith.kit.processed import Processor
from shardsmith.kit.reader import BadRecord, Reader, Task
from shardsmith.kit.row_processor import RowProcessor
from shardsmith.kit.transform import Transform, prepare_all, transform_inputs
from shardsmith.storage import arrival
from shardsmith.text.cleaning import CleaningSpec

__all__ = ["ConvertOptions", "job_of", "run", "summary_line"]


def job_of(opts: ConvertOptions) -> Job:
    """The conversion ``opts`` describe: convert's own steps, or the job of the command that writes
    the ``--to`` format (``FormatOptions.command``: ``tokens``, ``pack-tokens``' job)."""
    command = _writing_command(opts.to)
    if command is not None:
        return COMMAND_JOBS[command](opts)
    return Job(command="convert", steps=ConvertSteps, opts=opts, source=opts.source, transforms=opts.transforms,
               format=opts.to)


def _token_job(opts: ConvertOptions) -> Job:
    from shardsmith.commands.convert_tokens import token_job

    return token_job(opts)


def _token_summary(out: Any, manifest: dict[str, Any]) -> str:
    from shardsmith.commands.pack_tokens import summary_line

    return summary_line(out, manifest)


# the commands whose job ``convert --to`` builds for a format that names one (``FormatOptions.command``),
# and their runs' one-line summaries
COMMAND_JOBS: dict[str, Callable[[ConvertOptions], Job]] = {"pack-tokens": _token_job}
COMMAND_SUMMARIES: dict[str, Callable[[Any, dict[str, Any]], str]] = {"pack-tokens": _token_summary}


def summary_line(opts: ConvertOptions, out: Any, manifest: dict[str, Any]) -> str | None:
    """The summary of a run of another command's job (``pack-tokens``' line), None for convert's own."""
    command = _writing_command(opts.to)
    return None if command is None else COMMAND_SUMMARIES[command](out, manifest)


def _writing_command(to: str) -> str | None:
    """The command whose job writes the format of ``--to TO`` (None: convert's own steps)."""
    declared = [d for d in registry.format_options().values() if d.to == to and d.command]
    if declared and declared[0].command not in COMMAND_JOBS:
        raise UsageError(f"--to {to}: its format names the command {declared[0].command!r} as its writer, "
                         f"which convert does not know")
    return declared[0].command if declared else None


def run(opts: ConvertOptions, *, executor: Executor | None = None) -> dict[str, Any]:
    """The whole command (or its ``--stage``), here or on ``executor`` (``shardsmith.executors``); returns the
    manifest it wrote (``--no-wait``: the jobs submitted)."""
    return run_job(job_of(opts)) if executor is None else executor.run(job_of(opts))


class ConvertSteps(JobSteps):
    """Which source and format, then the steps of the record kind the source holds."""

    def open(self, run: JobRun) -> JobSteps:
        cls, fmt = source_and_format(run)
        if (own := registry.format_options().get(fmt.name)) is not None and own.command:
            raise UsageError(f"--to {fmt.option} is written by the {own.command} job: build it with "
                             f"shardsmith.commands.convert.job_of")
        run.opts = run.opts.for_format(fmt, registry.format_options(), holds=cls.holds)  # refuses another's
        run.reader, run.fmt = cls.from_options(run.opts), fmt
        return registry.record_kind(cls.holds, source=cls.name).steps()(job=self.job)  # type: ignore[no-any-return]


class RowSteps(JobSteps):
    """Rows into samples: the source's fields (``Reader.sample_fields``) as a neutral sample, which
    the format's encoder makes its bytes (``Format.encoder``); images: ``ImageSteps``."""

    classes: list[str] | None = None
    balance: BalancePlan | None = None
    transforms: list[Transform]
    samples: ImageProcessor | None = None  # (images)

    def check(self, run: JobRun) -> None:
        opts, reader = run.opts, run.reader
        if opts.provenance:
            raise UsageError("--provenance applies to events (ROOT, Parquet events)")
        if callable(getattr(reader, "fields", None)):  # a source written before formats encoded samples
            raise UsageError(f"source {reader.name!r} makes tar members (fields), which the format makes now: "
                             f"give the record's typed fields with sample_fields instead (docs/plugins.md)")
        self.check_augment(opts)
        self.transforms = registry.record_kind(reader.holds).transforms(self.job.transforms, opts=opts)
        files = run.files or []
        # image bytes that pass through unchanged are referenced by the workers and copied by the writer
        sources = paths_of(files) if self.copies_files(run) else None
        if opts.balance is not None:  # files left out of a class keep their indexes in the writers' sources
            run.files, self.balance = self.balanced(files, opts)
        run.make_write(sources=sources, options=run.opts.format_values())
        with no_gc():
            self.classes = self.classes_of(run)
            wait_to_check(reader, run.files or [])  # inputs from a URL that the check reads
            reader.check(run.files or [], opts)
            # the inputs' own types, for a format of typed columns (a transform may change a field's
            # values: they are typed from themselves then)
            types = None if self.transforms else reader.arrow_types(run.files or [])
            if types is not None and run.write is not None and run.write.schema is None:
                run.write = dataclasses.replace(run.write, schema=types)

    def check_augment(self, opts: Any) -> None:
        """``--augment`` and ``--copies``, refused where they do not apply."""
        if opts.augment:
            raise UsageError("--augment applies to image folders")
        _copies_need_augment(opts)

    def balanced(self, files: list[Any], opts: Any) -> tuple[list[Any], BalancePlan]:
        """``--balance``: the files kept, and the plan (classes are image folders here)."""
        raise UsageError("--balance applies to image folders (class = folder) and events (,label=FIELD)")

    def classes_of(self, run: JobRun) -> list[str] | None:
        """The class names that label the samples (None: unlabelled)."""
        return None

    def cleaning(self, run: JobRun) -> CleaningSpec | None:
        opts = run.opts
        if not (opts.dedup or opts.decontaminate):
            return None
        if not registry.record_kind(run.reader.holds).text_fields or not opts.text_field:
            raise UsageError("--dedup and --decontaminate compare the documents' text: give --text-field (JSONL, "
                             "Parquet)")
        return CleaningSpec.of(opts, units="bytes")

    def extra_inputs(self, run: JobRun) -> tuple[str | None, ...]:
        return (*super().extra_inputs(run), *run.opts.decontaminate, *transform_inputs(self.transforms))

    def estimated_bytes(self, run: JobRun) -> int:
        return super().estimated_bytes(run) * run.opts.copies

    def processor(self, run: JobRun) -> Processor:
        assert run.write is not None
        if any(t.samples for t in self.transforms):  # decided once a run, before the workers get them
            opts = run.opts
            decisions = cached("transforms", lambda: prepare_all(self.transforms, lambda: _first_records(
                run.reader, run.tasks or [])), stage=opts.stage, out=opts.out, run=run.identity, dump=list, load=list)
            for t, decision in zip(self.transforms, decisions, strict=True):
                if t.samples:
                    t.prepared(decision)
        kind = registry.record_kind(run.reader.holds).payload_kind
        return RowProcessor(reader=run.reader, encoder=run.fmt.encoder(run.write, kind), text_field=run.opts.text_field,
                            transforms=self.transforms)

    def schema(self, run: JobRun) -> dict[str, Any]:
        """The manifest's ``schema``: the source's fields as the format's encoder writes them."""
        assert run.write is not None
        kind = registry.record_kind(run.reader.holds)
        text_from = run.opts.text_field if kind.text_fields else None
        fields = run.reader.sample_schema(run.opts)
        for transform in self.transforms or ():
            fields = transform.fields_after(fields)
        return run.fmt.encoder(run.write, kind.payload_kind).schema(fields, text_from=text_from)

    def describe(self, run: JobRun, done: Converted) -> Described:
        opts, reader = run.opts, run.reader
        extras: dict[str, Any] = {"copies": opts.copies}
        if self.balance is not None:
            extras["balance"] = self.balance.describe()
        if self.classes is not None:
            extras["classes"] = self.classes
            extras["max_image_pixels"] = opts.max_image_pixels  # what verify --deep and the loader accept
        if opts.augment:
            assert self.samples is not None
            extras["augment"] = {**self.samples.augmenter.describe(), "copies": opts.copies}
        if self.transforms:
            extras["transforms"] = [t.describe() for t in self.transforms]
        schema = self.schema(run)
        source = {"reader": reader.name, **reader.source_fields(opts),
                  "check_images": opts.check_images if self.classes is not None else None}  # (images)
        used = [("source", reader.name), ("kind", reader.holds), *(("transform", t.name) for t in self.transforms)]
        if opts.augment:
            used.append(("transform", "augment"))
        return Described(source=source, schema=schema, extras=extras, used=tuple(used), copies=opts.copies)


class ImageSteps(RowSteps):
    """Image files into tar samples: unchanged (the engine's copy mode) or augmented, labelled by class."""

    def check_augment(self, opts: Any) -> None:
        _copies_need_augment(opts)
        if opts.augment:  # a usage error now, not in a worker
            augmenter = registry.get("transform", "augment").from_spec(opts.augment, opts=opts)
            if opts.copies > 1 and not augmenter.random:
                raise UsageError(f"--copies {opts.copies}: {opts.augment!r} has no random op, so every copy would "
                                 f"be the same image")

    def balanced(self, files: list[Any], opts: Any) -> tuple[list[Any], BalancePlan]:
        return balance_files(files, BalanceSpec.parse(opts.balance), seed=opts.seed)

    def processor(self, run: JobRun) -> ImageProcessor:
        """Each image file its samples, which the format encodes (``Format.encoder``)."""
        assert run.write is not None
        kind = registry.record_kind(run.reader.holds).payload_kind
        self.samples = ImageProcessor(classes=self.classes or [], opts=run.opts, encoder=run.fmt.encoder(run.write, kind))
        return self.samples

    def classes_of(self, run: JobRun) -> list[str] | None:
        return run.reader.classes(run.files)  # type: ignore[attr-defined,no-any-return]

    def copies_files(self, run: JobRun) -> bool:
        return not run.opts.augment


def _copies_need_augment(opts: Any) -> None:
    if opts.copies > 1 and not opts.augment:
        raise UsageError("--copies needs --augment (identical copies would only repeat samples)")


def _first_records(reader: Reader, tasks: list[Task]) -> Iterator[tuple[str, int, Any]]:
    """The good records of the tasks in input order, as ``(file, record, value)``, read as the
    caller takes them (a transform's ``prepare`` stops when it has seen enough)."""
    for task in tasks:
        arrival.wait_whole((task.file,))  # an input still being staged from a URL
        for record, value in reader.read(task):
            if not isinstance(value, BadRecord):
                yield task.file.rel, record, value
