"""``shardsmith convert --to webdataset``: image folders, JSONL and Parquet into exactly shuffled tar shards."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.images import MAX_IMAGE_PIXELS, ImageError, canonical_ext, check_image
from shardsmith.core.memory import no_gc
from shardsmith.core.progress import Progress
from shardsmith.core.sample import Identity
from shardsmith.engine.inputs import InputFile, discover
from shardsmith.engine.pipeline import (
    Converted,
    ConvertingOptions,
    Processed,
    Sizing,
    Tally,
    TaskResult,
    convert_all,
    scatter_summary,
)
from shardsmith.engine.resume import run_identity
from shardsmith.engine.session import OutputRun, output_run
from shardsmith.errors import DataError, UsageError
from shardsmith.formats.webdataset.image_tar import plan_shards, write_all
from shardsmith.formats.webdataset.tarfmt import member_header, sample_members
from shardsmith.formats.webdataset.writer import SourceRef, TarWriter
from shardsmith.sources.base import Reader, Task
from shardsmith.sources.imagefolder import ImageFolderReader
from shardsmith.sources.jsonl import JsonlReader
from shardsmith.sources.parquet import ParquetReader

_EXT_OK = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, kw_only=True)
class ConvertOptions(ConvertingOptions):
    inputs: tuple[str, ...]
    out: Path
    to: str = "webdataset"
    source: str | None = None
    text_field: str | None = None
    check_images: str = "header"
    max_image_pixels: int = MAX_IMAGE_PIXELS  # at every check level but "none", augmenting too
    augment: str | None = None
    copies: int = 1
    quality: int = 90
    shard_samples: int | None = None
    shard_bytes: int = 256_000_000
    wids_md5: bool = False
    # events (ROOT, Parquet)
    tree: str | None = None
    branches: tuple[str, ...] | None = None
    step_size: int = 64 << 20
    group_by: str | None = None
    events_table: str | None = None
    compression: str = "none"
    events_per_sample: int = 1

    def __post_init__(self) -> None:
        if type(self.max_image_pixels) is not int or self.max_image_pixels < 1:
            raise UsageError(f"--max-image-pixels must be a whole number >= 1, got {self.max_image_pixels!r}")


READERS = {"imagefolder": ImageFolderReader, "jsonl": JsonlReader, "parquet": ParquetReader}
EVENT_SUFFIXES = {"root": (".root",)}


def infer_source(files: list[InputFile]) -> str:
    """The input kind from the inputs' suffixes: images, JSONL or Parquet (one kind per conversion)."""
    suffixes = {**{kind: cls.suffixes for kind, cls in READERS.items()}, **EVENT_SUFFIXES}
    # every path, each ended by a NUL (never part of a path): "x.jsonl.gz\0" holds ".jsonl.gz\0"
    # exactly when the path ends with that suffix -- a few C-speed searches, not a test per file
    paths = ("\0".join([f.path for f in files]) + "\0").lower()
    kinds = {kind for kind, sfx in suffixes.items() if any(s + "\0" in paths for s in sfx)}
    if len(kinds) > 1:
        raise UsageError(f"the inputs hold several kinds ({', '.join(sorted(kinds))}); choose one with --from")
    return kinds.pop()


class SampleProcessor:
    """Builds each sample's tar members in the worker, so the gather only appends bytes."""

    def __init__(self, *, kind: str, classes: list[str] | None, text_field: str | None, check_images: str,
                 augment: str | None, copies: int, quality: int, seed: int,
                 max_image_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.kind = kind
        self.classes = {name: i for i, name in enumerate(classes or [])}
        self.labels = {name: str(i).encode() for name, i in self.classes.items()}  # the .cls member of each class
        self.text_field = text_field
        self.check_images = check_images
        self.max_image_pixels = max_image_pixels
        self.augment = augment
        self.copies = copies
        self.quality = quality
        self.seed = seed
        self._augmenter: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_augmenter": None}

    @property
    def augmenter(self) -> Any:
        if self._augmenter is None and self.augment:
            from shardsmith.transforms.augment import Augmenter, parse_augment

            self._augmenter = Augmenter(ops=parse_augment(self.augment), quality=self.quality, seed=self.seed,
                                        max_image_pixels=self.max_image_pixels)
        return self._augmenter

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed:
        pieces: list[bytes | memoryview] = []
        lengths: list[int] = []
        records: list[int] = []
        bad: list[tuple[int, str]] = []
        for record, value in batch:
            try:
                samples = self._samples(task, record, value)
            except _Bad as exc:
                bad.append((record, str(exc)))
                continue
            try:
                self._members(samples, pieces, lengths, records, record)
            except ValueError as exc:  # a member name tar cannot hold
                bad.append((record, str(exc)))
        payload = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        return Processed(records=np.asarray(records, dtype=np.int64), lengths=np.asarray(lengths, dtype=np.int64),
                         payload=payload, bad=bad, copies=self.copies)

    # Images that go into the tar unchanged (no augmentation), as ``_image`` makes their samples:
    # the direct path's workers (``writers.image_tar.ImageSamples``) ask for keys and labels a shard
    # at a time, and for each extension once its bytes are read.

    def image_keys(self, files: Sequence[InputFile]) -> list[str]:
        return [Identity(f.rel, 0).key() for f in files]

    def image_labels(self, files: Sequence[InputFile]) -> list[bytes]:
        labels = self.labels
        return [labels[f.group] for f in files]

    def image_ext(self, file: InputFile, data: bytes | memoryview) -> str:
        """The member extension of a checked image; a bad one raises DataError. Called once per image: lean."""
        try:
            info = check_image(data, level=self.check_images, max_pixels=self.max_image_pixels)
        except ImageError as exc:
            raise DataError(file=file.rel, reason=str(exc), unit="image", skippable=True) from None
        return canonical_ext(info.format) if info else _suffix_ext(file.path)

    def _members(self, samples: list[tuple[str, list[tuple[str, Any]]]], pieces: list[bytes | memoryview],
                 lengths: list[int], records: list[int], record: int) -> None:
        built = []
        for key, fields in samples:
            if fields and isinstance(fields[0][1], SourceRef):
                ext, ref = fields[0]
                built.append([member_header(f"{key}.{ext}", ref.size), ref.pack(), *sample_members(key, fields[1:])])
            else:
                built.append(sample_members(key, fields))
        for copy, members in enumerate(built):  # all of a record's samples, or none of them
            pieces.extend(members)
            lengths.append(sum(len(m) for m in members))
            records.append(record * self.copies + copy)

    def _samples(self, task: Task, record: int, value: Any) -> list[tuple[str, list[tuple[str, bytes]]]]:
        if self.kind == "imagefolder":
            file, data = value
            return self._image(file, data)
        ident = Identity(task.file.rel, record)
        if self.kind == "jsonl":
            return [(ident.key(), self._jsonl(value))]
        return [(ident.key(), self._row(value))]

    def _image(self, file: InputFile, data: bytes) -> list[tuple[str, list[tuple[str, bytes]]]]:
        try:
            info = check_image(data, level=self.check_images, max_pixels=self.max_image_pixels)
        except ImageError as exc:
            raise _Bad(str(exc)) from None
        label = str(self.classes[file.group]).encode()
        ident = Identity(file.rel, 0)
        if self.augmenter is None:
            # zero copy: the tar writer copies the bytes straight from the input file
            ext = canonical_ext(info.format) if info else _suffix_ext(file.path)
            return [(ident.key(), [(ext, SourceRef(index=file.index, size=len(data))), ("cls", label)])]
        out = []
        for copy in range(self.copies):
            try:
                jpeg = self.augmenter.apply(data, identity=file.rel, copy=copy)
            except ImageError as exc:
                raise _Bad(str(exc)) from None
            out.append((ident.key(copy if self.copies > 1 else None), [("jpg", jpeg), ("cls", label)]))
        return out

    def _jsonl(self, value: Any) -> list[tuple[str, bytes]]:
        if not isinstance(value, dict):
            raise _Bad(f"expected a JSON object, got {type(value).__name__}")
        return [("json", orjson.dumps(value)), *self._text(value)]

    def _text(self, record: dict[str, Any]) -> list[tuple[str, bytes]]:
        """The ``txt`` member from ``--text-field``, if asked for."""
        if not self.text_field:
            return []
        text = record.get(self.text_field)
        if not isinstance(text, str):
            raise _Bad(f"no string {self.text_field!r} field")
        return [("txt", text.encode("utf-8"))]

    def _row(self, row: dict[str, Any]) -> list[tuple[str, bytes]]:
        binary = [(k, v) for k, v in row.items() if isinstance(v, bytes | bytearray)]
        rest = {k: v for k, v in row.items() if not isinstance(v, bytes | bytearray)}
        fields = [(member_ext(k), bytes(v)) for k, v in binary]
        if rest:
            fields.append(("json", orjson.dumps(rest, default=str, option=orjson.OPT_SERIALIZE_NUMPY)))
        return fields + self._text(row)


def member_ext(column: str) -> str:
    """The tar member extension of a binary Parquet column: its name, cleaned of dots and slashes."""
    return column if _EXT_OK.match(column) else re.sub(r"[^A-Za-z0-9_-]", "_", column)


def check_parquet_columns(files: list[InputFile], text_field: str | None) -> None:
    """Every Parquet file has the same columns, and they make distinct, short member names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first: tuple[str, Any] | None = None
    for f in files:
        try:
            schema = pq.read_schema(f.path)
        except Exception as exc:  # pyarrow's errors for a file that is not Parquet
            raise DataError(file=f.rel, reason=f"not a readable Parquet file: {exc}") from None
        if first is None:
            first = (f.rel, schema)
        elif not schema.equals(first[1]):
            raise UsageError(f"{f.rel}: its columns ({', '.join(schema.names)}) differ from those of {first[0]} "
                             f"({', '.join(first[1].names)}); convert files of one schema at a time")
    assert first is not None
    schema = first[1]
    binary = [n for n in schema.names if pa.types.is_binary(schema.field(n).type)
              or pa.types.is_large_binary(schema.field(n).type)]
    taken = {"json": "the other columns"} if len(binary) < len(schema.names) else {}
    if text_field:
        taken["txt"] = f"--text-field {text_field}"
    for name in binary:
        ext = member_ext(name)
        if ext in taken:
            raise UsageError(f"{first[0]}: binary column {name!r} would be the member .{ext}, as {taken[ext]} is; "
                             f"rename it")
        if len(ext.encode()) > 30:
            raise UsageError(f"{first[0]}: binary column {name!r} makes a member name longer than tar allows "
                             f"(30 bytes for the extension); rename it")
        taken[ext] = f"column {name!r}"


class _Bad(Exception):
    """A record that cannot become a sample (the reason is the message)."""


def _suffix_ext(path: str) -> str:
    ext = Path(path).suffix.lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext


def run(opts: ConvertOptions) -> dict[str, Any]:
    """The whole command, holding its output folder (``session``); returns the manifest it wrote."""
    if opts.idle_rank():
        return scatter_summary(opts, None)
    with output_run(out=opts.out, overwrite=opts.overwrite, stage=opts.stage, rank=opts.rank,
                    quiet=opts.quiet) as session:
        return _run(opts, session)


def _run(opts: ConvertOptions, session: OutputRun) -> dict[str, Any]:
    files: list[InputFile] | None = None
    if opts.source is None:
        with no_gc():
            files = discover(list(opts.inputs), suffixes=(*(s for c in READERS.values() for s in c.suffixes),
                                                          *(s for v in EVENT_SUFFIXES.values() for s in v)))
            kind = infer_source(files)  # one kind only, so these are exactly that reader's files
    else:
        kind = opts.source
    if kind == "parquet" and (opts.to == "hdf5" or opts.group_by or opts.events_table):
        kind = "parquet-events"
    if kind not in READERS:  # physics events: ROOT, or Parquet read as events
        from shardsmith.commands.convert_events import run_events
        from shardsmith.core.memory import keep_freed_memory

        keep_freed_memory()
        if files is None:
            files = discover(list(opts.inputs), suffixes=(".parquet", ".pq") if kind != "root" else (".root",))
        return run_events(opts, kind, files, Progress(quiet=opts.quiet), session)
    if opts.to != "webdataset":
        raise UsageError(f"--to {opts.to} holds physics events (ROOT or Parquet inputs); {kind} inputs go "
                         f"--to webdataset")
    if opts.augment and kind != "imagefolder":
        raise UsageError("--augment applies to image folders")
    if opts.copies > 1 and not opts.augment:
        raise UsageError("--copies needs --augment (identical copies would only repeat samples)")
    if opts.augment:
        from shardsmith.transforms.augment import Augmenter, parse_augment

        # a usage error now, not in a worker
        if opts.copies > 1 and not Augmenter(ops=parse_augment(opts.augment), quality=opts.quality).random:
            raise UsageError(f"--copies {opts.copies}: {opts.augment!r} has no random op, so every copy would be "
                             f"the same image")
    reader: Reader = READERS[kind]()
    # images unchanged, in one process, stopping at the first bad one: the whole output follows from the listing
    direct = (kind == "imagefolder" and not opts.augment and opts.stage is None and opts.limit is None
              and opts.on_error == "fail")
    with no_gc():
        if files is None:
            files = discover(list(opts.inputs), suffixes=reader.suffixes)
        classes = reader.classes(files) if isinstance(reader, ImageFolderReader) else None
        if kind == "parquet":
            check_parquet_columns(files, opts.text_field)
        total_bytes = sum(f.size for f in files)
        sizing = Sizing.of(memory=opts.memory, workers=opts.workers, input_bytes=total_bytes)
        reader.limit_records(sizing.record_bytes)
        run_id = run_identity("convert", opts, files)
        if (finished := session.claim(run_id)) is not None:
            return finished
        tasks: list[Task] = []
        if not direct:
            from shardsmith.core.memory import keep_freed_memory
            from shardsmith.engine.plan import plan_tasks

            keep_freed_memory()
            tasks = plan_tasks(reader, files, chunk_bytes=sizing.chunk_bytes, stage=opts.stage, out=opts.out,
                               run=run_id)
        plans = _plan_images(opts, files) if direct else {}
    progress = Progress(quiet=opts.quiet)
    processor = SampleProcessor(kind=kind, classes=classes, text_field=opts.text_field,
                                check_images=opts.check_images, augment=opts.augment, copies=opts.copies,
                                quality=opts.quality, seed=opts.seed, max_image_pixels=opts.max_image_pixels)
    if direct:
        writers, results = _write_images(opts, files, plans, processor, progress)
    else:
        done = _shuffled(opts, kind, files, reader, processor, tasks, sizing, progress, run_id)
        if done.summary is not None:
            return done.summary
        writers, results = done.outputs, done.results
    tally = Tally.of(results, writers, copies=opts.copies, inputs=files)
    splits = {name: {"samples": sum(s.samples for s in w.shards), "shards": [s.to_json() for s in w.shards],
                     "wids": f"{name}.wids.json"} for name, w in writers.items()}
    extras: dict[str, Any] = {"copies": opts.copies}
    if classes is not None:
        extras["classes"] = classes
        extras["max_image_pixels"] = opts.max_image_pixels  # what verify --deep and the loader accept
    if opts.augment:
        extras["augment"] = {**processor.augmenter.describe(), "copies": opts.copies}
    manifest = manifest_mod.new_manifest(
        fmt="webdataset", seed=opts.seed, shuffle=opts.shuffle,
        source={"reader": kind, "inputs": [f.rel for f in files] if len(files) <= 1000 else len(files),
                "input_bytes": total_bytes, **tally.source(), "limit": opts.limit,
                "check_images": opts.check_images if kind == "imagefolder" else None},
        schema=_schema(kind, opts), splits=splits, **extras)
    return session.commit(manifest)


@dataclass
class _Written:
    """A split's finished shards, as ``Tally`` reads them from a writer."""

    shards: list[Any]


def _plan_images(opts: ConvertOptions, files: list[InputFile]) -> dict[str, list[Any]]:
    """Images unchanged: every split's shards, planned from the listing (no shuffle pass)."""
    return plan_shards(files, seed=opts.seed, shuffle=opts.shuffle, splits=opts.splits,
                       shard_samples=opts.shard_samples, shard_bytes=opts.shard_bytes, out_dir=opts.out,
                       wids_md5=opts.wids_md5)


def _write_images(opts: ConvertOptions, files: list[InputFile], plans: dict[str, list[Any]],
                  processor: SampleProcessor, progress: Progress) -> tuple[dict[str, Any], list[TaskResult]]:
    """The planned shards, written by workers."""
    with progress.bar(total=sum(f.size for f in files), desc="convert", unit="B") as bar:
        shards = write_all(plans, images=processor, workers=opts.workers, progress=bar.update,
                           out_dir=opts.out)
    return {name: _Written(shards=s) for name, s in shards.items()}, [TaskResult(task=0, records=len(files))]


def _shuffled(opts: ConvertOptions, kind: str, files: list[InputFile], reader: Reader, processor: SampleProcessor,
              tasks: list[Task], sizing: Sizing, progress: Progress, run_id: dict[str, str]) -> Converted:
    """The general path: scatter into the keyed shuffle, gather into tar writers."""
    total_bytes = sum(f.size for f in files)
    # image bytes that pass through unchanged are referenced by the workers and copied by the writer
    sources = [f.path for f in files] if kind == "imagefolder" and not opts.augment else None
    return convert_all(
        opts=opts, out=opts.out, reader=reader, processor=processor, tasks=tasks, sizing=sizing,
        estimated_bytes=total_bytes * opts.copies, desc="convert", progress=progress, run=run_id,
        make_writer=lambda split, part: TarWriter(
            out_dir=opts.out, split=split, shard_samples=opts.shard_samples, shard_bytes=opts.shard_bytes,
            wids_md5=opts.wids_md5, sources=sources, threads=max(2, opts.workers), part=part))


def _schema(kind: str, opts: ConvertOptions) -> dict[str, Any]:
    if kind == "imagefolder":
        return {"image": {"kind": "image", "ext": "jpg" if opts.augment else "as stored"},
                "cls": {"kind": "int", "dtype": "int64"}}
    schema: dict[str, Any] = {"json": {"kind": "json"}}
    if kind == "parquet":
        schema["binary columns"] = {"kind": "bytes", "ext": "column name"}
    if opts.text_field:
        schema["txt"] = {"kind": "text", "from": opts.text_field}
    return schema
