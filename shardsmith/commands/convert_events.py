"""``shardsmith convert`` for physics events: ROOT or Parquet events into HDF5 or tar shards.

Readers yield columns for many events at once; each chunk becomes one payload per event (see
``shardsmith.core.events``), goes through the same keyed shuffle as every other sample, and the
writer turns the shuffled records back into columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.events import EventChunk, EventSchema, encode, record_lengths
from shardsmith.core.progress import Progress
from shardsmith.engine.inputs import InputFile
from shardsmith.engine.pipeline import Processed, Sizing, Tally, convert_all
from shardsmith.engine.plan import plan_tasks
from shardsmith.engine.resume import run_identity
from shardsmith.errors import UsageError
from shardsmith.formats.writer import ShardRange
from shardsmith.sources.base import Reader, Task

if TYPE_CHECKING:
    from shardsmith.commands.convert import ConvertOptions
    from shardsmith.engine.session import OutputRun

EVENT_KINDS = ("root", "parquet-events")
MAX_FIELD_NAME = 84  # a tar member is e0123456789.{field}.npy within ustar's 100 bytes


class EventProcessor:
    """Encodes a chunk's events into per-event records in the worker (no loop per event)."""

    def __init__(self, *, schema: EventSchema) -> None:
        self.schema = schema

    def process_chunk(self, task: Task, chunk: EventChunk) -> Processed:
        records = np.arange(chunk.first, chunk.first + chunk.n, dtype=np.int64)
        schema = self.schema
        return Processed(records=records, lengths=record_lengths(chunk, schema), payload=None,
                         encode_in=lambda order: encode(chunk, schema, order=order)[1])

    def head(self, chunk: EventChunk, n: int) -> EventChunk:
        """The first ``n`` events (for ``--limit``)."""
        return chunk.take(np.arange(n), self.schema)

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed:
        raise TypeError("event readers yield chunks, not records")


def make_reader(kind: str, opts: ConvertOptions) -> Reader:
    branches = list(opts.branches) if opts.branches else None
    if kind == "root":
        from shardsmith.sources.root import RootReader

        if opts.group_by or opts.events_table:
            raise UsageError("--group-by and --events-table apply to Parquet events, not ROOT files")
        return RootReader(tree=opts.tree, branches=branches, step_bytes=opts.step_size)
    from shardsmith.sources.parquet_events import ParquetEventReader

    if opts.tree:
        raise UsageError("--tree applies to ROOT files")
    if opts.events_table and not opts.group_by:
        raise UsageError("--events-table joins per-event columns on --group-by; give both")
    return ParquetEventReader(columns=branches, group_by=opts.group_by, events_table=opts.events_table,
                              step_bytes=opts.step_size)


def run_events(opts: ConvertOptions, kind: str, files: list[InputFile], progress: Progress,
               session: OutputRun) -> dict[str, Any]:
    """Read, shuffle and write events into the folder ``session`` holds; returns the manifest it wrote."""
    if opts.augment or opts.copies > 1 or opts.text_field:
        raise UsageError("--augment, --copies and --text-field do not apply to events")
    if opts.events_per_sample > 1 and opts.to != "webdataset":
        raise UsageError("--events-per-sample packs events into tar samples: it needs --to webdataset")
    reader = make_reader(kind, opts)
    schema, skipped_fields = reader.schema(files)  # type: ignore[attr-defined]
    if not schema.fields:
        raise UsageError(f"{files[0].rel}: no numeric fields to convert" + (
            f" (skipped: {', '.join(skipped_fields[:5])})" if skipped_fields else ""))
    if skipped_fields:
        more = f" and {len(skipped_fields) - 8} more" if len(skipped_fields) > 8 else ""
        progress.note(f"shardsmith: warning: skipping {len(skipped_fields)} non-numeric fields: "
                      f"{', '.join(skipped_fields[:8])}{more}")
    if opts.to == "webdataset":
        long = [f.name for f in schema.fields if len(f.name.encode()) > MAX_FIELD_NAME]
        if long:
            raise UsageError(f"field {long[0]!r} is too long for a tar member name ({MAX_FIELD_NAME} bytes at "
                             f"most); use --to hdf5 or leave it out with --branches")
    total_bytes = sum(f.size for f in files)
    sizing = Sizing.of(memory=opts.memory, workers=opts.workers, input_bytes=total_bytes)
    run_id = run_identity("convert", opts, files, extra_paths=(opts.events_table,))
    if (finished := session.claim(run_id)) is not None:
        return finished
    tasks = plan_tasks(reader, files, chunk_bytes=sizing.chunk_bytes, stage=opts.stage, out=opts.out, run=run_id)
    done = convert_all(
        opts=opts, out=opts.out, reader=reader, processor=EventProcessor(schema=schema), tasks=tasks, sizing=sizing,
        # compressed inputs grow when decoded: size the shuffle's buckets for a few times the input
        estimated_bytes=4 * total_bytes, desc="convert", progress=progress, run=run_id,
        make_writer=lambda split, part: _writer(opts, split, schema, part))
    if done.summary is not None:
        return done.summary
    writers, results = done.outputs, done.results
    events = {name: getattr(w, "events", None) or sum(s.samples for s in w.shards) for name, w in writers.items()}
    tally = Tally.of(results, writers, inputs=files, written=sum(events.values()))
    splits: dict[str, Any] = {}
    for name, w in writers.items():
        splits[name] = {"samples": sum(s.samples for s in w.shards), "events": events[name],
                        "shards": [s.to_json() for s in w.shards]}
        if opts.to == "webdataset":
            splits[name]["wids"] = f"{name}.wids.json"
    extras: dict[str, Any] = {"events": {"counters": list(schema.counters), "skipped_fields": skipped_fields}}
    if opts.to == "webdataset":
        extras["events"]["events_per_sample"] = opts.events_per_sample
    else:
        extras["hdf5"] = {"compression": opts.compression}
    source = {"reader": kind, "inputs": [f.rel for f in files] if len(files) <= 1000 else len(files),
              "input_bytes": total_bytes, **tally.source(), "limit": opts.limit}
    if kind == "root":
        source["tree"] = getattr(reader, "tree_name", None) or opts.tree
    else:
        source["group_by"] = opts.group_by
    manifest = manifest_mod.new_manifest(fmt=opts.to, seed=opts.seed, shuffle=opts.shuffle, source=source,
                                         schema=schema.to_json(), splits=splits, **extras)
    return session.commit(manifest)


def _writer(opts: ConvertOptions, split: str, schema: EventSchema, part: ShardRange) -> Any:
    if opts.to == "hdf5":
        from shardsmith.formats.hdf5.writer import HDF5Writer

        return HDF5Writer(out_dir=opts.out, split=split, schema=schema, shard_samples=opts.shard_samples,
                          shard_bytes=opts.shard_bytes, compression=opts.compression, part=part)
    from shardsmith.formats.event_tar.writer import EventTarWriter

    return EventTarWriter(out_dir=opts.out, split=split, schema=schema, events_per_sample=opts.events_per_sample,
                          shard_samples=opts.shard_samples, shard_bytes=opts.shard_bytes, part=part)
