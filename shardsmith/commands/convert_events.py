"""``shardsmith convert`` for physics events: ROOT or Parquet events into HDF5 or tar shards, or memmap
arrays; the steps ``convert``'s job takes when its source holds events.

Readers yield columns for many events at once; each chunk becomes one record per event, as the
format's encoder makes them (``Format.encoder``; by default ``core.events``' records), goes through
the same keyed shuffle as every other sample, and the writer turns the shuffled records back into
columns.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from shardsmith import registry
from shardsmith.core import provenance
from shardsmith.core.events import EventSchema
from shardsmith.core.input_file import InputFile
from shardsmith.core.words import plural
from shardsmith.engine import Converted, Described, JobRun, JobSteps
from shardsmith.engine.inputs.plan import cached, wait_to_check
from shardsmith.engine.output.resume import run_identity
from shardsmith.errors import DataError, DatasetError, UsageError
from shardsmith.kit.downsample import BalancePlan, BalanceSpec, balance_events
from shardsmith.kit.reader import Reader
from shardsmith.transforms.event_payload import EventProcessor

if TYPE_CHECKING:
    from shardsmith.commands.convert_options import ConvertOptions


class EventSteps(JobSteps):
    """Events: the schema read once, each event one record (the format's encoder's), the writer's
    columns from the schema."""

    def check(self, run: JobRun) -> None:
        opts, reader = run.opts, run.reader
        if opts.augment or opts.copies > 1 or opts.text_field:
            raise UsageError("--augment, --copies and --text-field do not apply to events")
        wait_to_check(reader, run.files or [])  # inputs from a URL: the schema reads every one
        run.files, self.unread, (schema, skipped) = _schema_once(opts, reader, run.files or [])
        if not schema.fields:
            raise UsageError(f"{run.files[0].rel}: no numeric fields to convert" + (
                f" (skipped: {', '.join(skipped[:5])})" if skipped else ""))
        if skipped:
            more = f" and {len(skipped) - 8:,} more" if len(skipped) > 8 else ""
            run.progress.note(f"shardsmith: warning: skipping {plural(len(skipped), 'field')} not numbers or lists of numbers "
                              f"(strings, records, nested collections): {', '.join(skipped[:8])}{more}")
        self.schema, self.skipped_fields = schema, skipped
        self.events = EventProcessor(schema=schema, balance=None,
                                     provenance=[f.rel for f in run.files] if opts.provenance else None)
        run.make_write(schema=self.events.out_schema, options=run.opts.format_values())

    def estimated_bytes(self, run: JobRun) -> int:
        """The selected fields decoded, from the inputs' metadata where the source knows it (ROOT:
        15.0 GB for the 10 GB bench file, whose spill is 15 GB); else 4x the inputs (compressed
        inputs grow when decoded: size the buckets for it)."""
        return run.reader.decoded_bytes() or 4 * super().estimated_bytes(run)

    def processor(self, run: JobRun) -> EventProcessor:
        """Each chunk's events as records the format's encoder makes (``Format.encoder``)."""
        opts, chunk_bytes = run.opts, run.sizing.chunk_bytes  # type: ignore[union-attr]
        assert run.write is not None
        self.events.balance = None if opts.balance is None else _balance(opts, run.reader, run.files or [],
                                                                         self.schema, chunk_bytes)
        self.events.encoder = run.fmt.encoder(run.write, registry.record_kind(run.reader.holds).payload_kind)
        return self.events

    def describe(self, run: JobRun, done: Converted) -> Described:
        opts, reader = run.opts, run.reader
        events: dict[str, Any] = {"counters": list(self.schema.counters), "skipped_fields": self.skipped_fields}
        if opts.provenance:
            events["provenance"] = provenance.describe(reader.provenance_entry())
        balance = self.events.balance
        return Described(source={"reader": reader.name, **reader.source_fields(opts)},
                         schema=run.write.schema.to_json(),  # type: ignore[union-attr]
                         extras={"events": events, **({"balance": balance.describe()} if balance is not None else {})},
                         events=True, used=(("source", reader.name), ("kind", reader.holds)), unread=self.unread,
                         list_inputs=opts.provenance)


def _balance(opts: ConvertOptions, reader: Reader, files: list[InputFile], schema: EventSchema,
             chunk_bytes: int) -> BalancePlan:
    """``--balance`` on events: the labels read by a reader of the label field alone (wide tables,
    ROOT), or by the run's reader when events are grouped from rows (``--group-by``)."""
    spec = BalanceSpec.parse(opts.balance or "")
    narrow = reader
    if spec.label is not None and opts.group_by is None and spec.label in {f.name for f in schema.fields}:
        narrow = type(reader).from_options(replace(opts, branches=(spec.label,)))
    return balance_events(spec, narrow, files, schema, seed=opts.seed, chunk_bytes=chunk_bytes)


def _schema_once(opts: ConvertOptions, reader: Reader, files: list[InputFile]
                 ) -> tuple[list[InputFile], list[dict[str, Any]], tuple[EventSchema, list[str]]]:
    """``_readable``, read once per staged run: the first process saves the answer in the scratch
    folder (``engine.inputs.plan.cached``, named by the inputs' identity and the options), the others take
    it instead of opening every input (the ROOT schema: importing uproot and awkward, reading each
    file's header: most of a gather or finalize process). The scatter still checks every file it
    reads against this schema (``RootReader._file_leaves``)."""
    if opts.stage is None or reader.schema_memo() is None:  # one process, or a reader that cannot recall
        return _readable(opts, reader, files)
    by_rel = {f.rel: f for f in files}

    def dump(value: tuple[list[InputFile], list[dict[str, Any]], tuple[EventSchema, list[str]]]) -> Any:
        readable, unread, (schema, skipped) = value
        return {"files": [f.rel for f in readable], "unread": unread, "schema": schema.to_json(),
                "skipped": skipped, "memo": reader.schema_memo()}

    def load(d: Any) -> tuple[list[InputFile], list[dict[str, Any]], tuple[EventSchema, list[str]]]:
        try:
            schema = EventSchema.from_json(d["schema"])
        except DatasetError as exc:
            raise ValueError(str(exc)) from None
        reader.recall_schema(schema, d["memo"])
        return [by_rel[rel] for rel in d["files"]], d["unread"], (schema, d["skipped"])

    run = run_identity("convert", opts, files, extra_paths=reader.extra_inputs(opts))
    return cached("schema", lambda: _readable(opts, reader, files), stage=opts.stage, out=opts.out, run=run,
                  dump=dump, load=load)


def _readable(opts: ConvertOptions, reader: Reader, files: list[InputFile]
              ) -> tuple[list[InputFile], list[dict[str, Any]], tuple[EventSchema, list[str]]]:
    """The inputs whose schema can be read, those left out, and the reader's schema of the rest: with
    ``--on-error skip`` a file that cannot be opened at all (truncated, corrupt) is left out and
    listed as unread; any other problem stops the run."""
    unread: list[dict[str, Any]] = []
    while True:
        try:
            return files, unread, reader.schema(files)  # type: ignore[attr-defined]
        except DataError as exc:
            left = [f for f in files if f.rel != exc.file]
            if opts.on_error != "skip" or not exc.skippable or exc.record is not None or len(left) == len(files):
                raise
            if not left:
                raise DataError(file=exc.file, reason=f"{exc.reason}; no input file is readable") from None
            unread.append({"file": exc.file, "record": None, "unread_tail": True,
                           "reason": f"{exc.reason} (the whole file is unread)"})
            files = left
