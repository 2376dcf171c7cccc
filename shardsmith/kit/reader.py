"""The source contract: split inputs into tasks, then read a task's records in order.

A source is a ``Reader`` subclass registered under a name (``shardsmith.registry``; plugins
through the ``shardsmith.sources`` entry-point group). It writes ``plan_file`` (how one file
splits into tasks) and ``read`` (the records of one task). Records come out as
``(record_number, value)``; a bad record comes out as a ``BadRecord`` instead of raising, so the
caller decides between failing and skipping. What the values are is ``holds``, a registered record
kind (``kit/record_kind.py``; the built-ins in ``kit/kinds.py``):

- ``"rows"``: a dict of fields per record; ``sample_fields`` gives its typed fields, which the
  worker makes a neutral ``Sample`` (``kit/sample.py``) that the chosen format encodes (webdataset:
  tar members), and ``pack-tokens`` reads its text field;
- ``"images"``: ``(InputFile, bytes)`` per image file, labelled by ``classes``;
- ``"events"``: ``EventChunk`` columns of many events at once (``columnar``), described by ``schema``;
- a plugin's own kind, registered in the ``shardsmith.kinds`` entry-point group.

Record numbers count from 0 in each file and never depend on the plan, so a sample's identity
(and with it its place in the shuffle) is the same for any task size, worker or rank count.
``shardsmith.testing.SourceContract`` checks a source against this contract, through the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from shardsmith.core.input_file import InputFile
from shardsmith.kit.sample import RecordError  # (defined with the sample it keeps a record from becoming)


@dataclass(frozen=True, slots=True)
class Task:
    """A contiguous run of records of one file: the unit of work a worker takes."""

    index: int
    file: InputFile
    start: int = 0
    stop: int = -1
    first_record: int = 0
    nbytes: int = 0
    files: tuple[InputFile, ...] = ()  # for readers whose records are whole files (one image each)


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record that could not be read, and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class StreamError(BadRecord):
    """The file cannot be read past this point (truncated, corrupt, unreadable): not a record."""


class Reader:
    """Base class of sources (docs/design.md, "Plugins"); the module docstring has the contract."""

    name: ClassVar[str] = ""
    suffixes: ClassVar[tuple[str, ...]] = ()  # lower-case file name endings this source reads
    unit: ClassVar[str] = "record"
    holds: ClassVar[str] = "rows"  # the registered record kind ``read`` yields: "rows", "images", "events"...
    byte_ranges: ClassVar[bool] = False  # whether a task's start/stop are byte offsets
    columnar: ClassVar[bool] = False  # whether ``read`` yields chunks of many records (``EventChunk``)
    events_variant: ClassVar[str | None] = None  # a source that reads the same files as events
    # URL schemes whose inputs this source opens where they are (its own ranged reads: only the bytes
    # it needs) instead of a staged copy; ``InputFile.path`` is then the URL (``engine/inputs/url_inputs.py``)
    opens_urls: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_options(cls, opts: Any) -> Reader:
        """The reader ``convert`` uses, from its options; a UsageError for an option it cannot honour."""
        return cls()

    @classmethod
    def for_text(cls, field: str) -> Reader:
        """The reader ``pack-tokens`` uses to read the text field ``field`` of each row."""
        return cls()

    @classmethod
    def for_records(cls) -> Reader:
        """The reader of whole rows, every field (``pack-tokens --chat`` reads several, some optional)."""
        return cls()

    @classmethod
    def wants_events(cls, opts: Any) -> bool:
        """Whether the options ask for this source's ``events_variant`` (e.g. ``--group-by``)."""
        return False

    def check(self, files: list[InputFile], opts: Any) -> None:
        """Refuse inputs this source cannot convert with these options, before any work (UsageError)."""

    def sample_fields(self, value: Any) -> dict[str, Any]:
        """A record's fields as a format receives them (``kit/sample.py``): names and typed values
        (str, bytes, int, float, bool, None, numpy arrays, lists and dicts of those), in order;
        never a format's layout (which fields become which tar members is webdataset's to say).
        A record that cannot be a sample raises RecordError. By default a row is its own fields."""
        if not isinstance(value, dict):
            raise RecordError(f"expected a record of named fields, got {type(value).__name__}")
        return value

    def sample_schema(self, opts: Any) -> dict[str, Any]:
        """The fields of the samples these records make: name -> ``{"kind": ...}`` (``"json"``,
        ``"bytes"``, ``"text"``, ``"int"``, ``"image"``), ``"*"`` (``kit.sample.OTHER_FIELDS``) for
        those it cannot name before reading them; the format's encoder makes it the manifest's
        ``schema`` (``SampleEncoder.schema``: webdataset names its members). Images: the members."""
        return {}

    def arrow_types(self, files: list[Any]) -> Any:
        """The Arrow schema of the records' fields where the inputs store them typed (a Parquet file's
        columns), else None. A value reaches the writers as JSON holds it (an ``int32`` as an int, a
        timestamp as its text), so a format of typed columns types it back (``WriteJob.schema``:
        ``formats/arrow_rows/source_types.py``); called after ``check``."""
        return None

    def source_fields(self, opts: Any) -> dict[str, Any]:
        """What this source adds to the manifest's ``source`` (a tree name, a grouping column...)."""
        return {}

    def extra_inputs(self, opts: Any) -> tuple[str | None, ...]:
        """Files besides the inputs that the output depends on (part of the run's fingerprint)."""
        return ()

    def schema_memo(self) -> dict[str, Any] | None:
        """Events sources: what reading the schema set on this reader, as JSON, so that the later
        processes of a staged run take the schema from the run's scratch folder instead of opening
        the inputs again (``recall_schema``); None (a property of the class): every process reads it."""
        return None

    def recall_schema(self, schema: Any, memo: dict[str, Any]) -> None:
        """Take the ``EventSchema`` an earlier process of the run read, with its ``schema_memo``."""
        raise NotImplementedError(f"{self.name} reads its schema in every process")

    def decoded_bytes(self) -> int | None:
        """Events sources: about how many bytes the selected fields of every input weigh decoded,
        as reading the schema found from the files' metadata (sizes the shuffle's buckets; part of
        ``schema_memo``, so every process of a staged run has the same); None: unknown."""
        return None

    max_record_bytes: int | None = None  # a record longer than this is a bad record, never held whole

    def limit_records(self, max_bytes: int) -> None:
        """Records longer than ``max_bytes`` (``Sizing.record_bytes``) are bad records, read past
        without being kept: one 200 MB line must not hold the memory a whole run was given."""
        self.max_record_bytes = max_bytes

    def plan(self, files: list[InputFile], *, chunk_bytes: int) -> list[Task]:
        """Tasks in input order; record numbers are per file, so identities never depend on the plan."""
        tasks: list[Task] = []
        for f in files:
            cuts = self.plan_file(f, chunk_bytes=chunk_bytes)
            for start, stop, first in cuts:
                nbytes = (stop - start) if self.byte_ranges and stop >= 0 else f.size // len(cuts)
                tasks.append(Task(index=len(tasks), file=f, start=start, stop=stop, first_record=first,
                                  nbytes=nbytes))
        return tasks

    def plan_file(self, file: InputFile, *, chunk_bytes: int) -> list[tuple[int, int, int]]:
        """``(start, stop, first_record)`` of each task of one file; one task by default."""
        return [(0, -1, 0)]

    def expected_tasks(self, file: InputFile, *, chunk_bytes: int) -> int | None:
        """About how many tasks ``plan_file`` will cut, known before the file is here (its size is
        listed): one per ``chunk_bytes`` for byte ranges; None where the file must be read to know."""
        return max(1, -(-file.size // chunk_bytes)) if self.byte_ranges else None

    def sample_tasks(self, file: InputFile, *, count: int, chunk_bytes: int, rng: Any) -> list[Task]:
        """At most ``count`` tasks of one file, chosen with ``rng`` (a numpy Generator), in file order:
        what ``inspect --report`` reads of it. By default a seeded choice among ``plan_file``'s."""
        cuts = self.plan_file(file, chunk_bytes=chunk_bytes)
        chosen = sorted(rng.choice(len(cuts), size=min(count, len(cuts)), replace=False).tolist())
        return [Task(index=k, file=file, start=a, stop=b, first_record=r,
                     nbytes=(b - a) if self.byte_ranges and b >= 0 else file.size // len(cuts))
                for k, (a, b, r) in enumerate(cuts[i] for i in chosen)]

    @property
    def plans_each_file(self) -> bool:
        """Whether ``plan(files)`` is the tasks of ``plan([f])`` for each file in turn (renumbered),
        so that a file's tasks can be planned before the next file is here: true of the default
        ``plan``; a source that overrides it is taken to plan files together."""
        return type(self).plan is Reader.plan

    def reads_to_check(self, file: InputFile) -> bool:
        """Whether ``check`` (or an events source's ``schema``) reads this file's bytes: an input
        staged from a URL that it reads is waited for first. True unless a source knows better."""
        return True

    def reads_to_plan(self, file: InputFile, *, chunk_bytes: int) -> bool:
        """Whether ``plan`` reads this file's bytes: an input staged from a URL is waited for before
        its tasks are planned; the others are planned from the listing and arrive while the run
        works. True unless a source knows better (a plugin's planner may read)."""
        return True

    def unit_for(self, file: InputFile) -> str:
        """How a record of this file is named in messages: ``line``, ``row``, ``entry``…"""
        return self.unit

    def provenance_entry(self) -> str:
        """What the entry of ``convert --provenance`` counts in this source's files (the manifest's
        ``events.provenance.entry_is``): the record unit unless the source says otherwise."""
        return self.unit

    def describe(self, task: Task, record: int) -> tuple[str, int | None]:
        """(file, record number) to name a record in messages and in the manifest's skip list."""
        return task.file.rel, record

    def identities(self, task: Task, records: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(relative path of each record — one entry if all share it —, record numbers, file indexes).

        Records of one file by default; a reader whose records are whole files (``task.files``)
        numbers them by position in the task and overrides this.
        """
        return [task.file.rel], records, np.full(len(records), task.file.index, dtype=np.int64)

    def read(self, task: Task) -> Iterator[tuple[int, Any | BadRecord]]:
        raise NotImplementedError

    def record_offsets(self, task: Task, records: np.ndarray) -> np.ndarray | None:
        """The byte offset (int64) in the file where each of ``records`` (ascending record numbers of
        ``task``) starts, so that ``--provenance`` leads straight back to it; None where a record has
        no byte offset (a compressed stream, a columnar file): the default."""
        return None

    def report(self, files: list[InputFile], sampling: Any) -> list[Any]:
        """``inspect INPUT... --report``: sections of the HTML report on these inputs before any
        conversion, from a seeded sample of files and records (``kit/sections/raw_inputs.py``, then
        the sections of the record kind the source ``holds``). A source may override it with its own."""
        from shardsmith import registry
        from shardsmith.kit.sections.raw_inputs import raw_sections

        return raw_sections(self, files, sampling, registry.record_kind(self.holds, source=self.name))


def located(file: str, record: int | None, unit: str) -> dict[str, Any]:
    """How the manifest's and ``--removed``'s lists name a record: its file, ``record`` (0-based) and,
    for a unit other than "record", the 1-based number in that unit (``line``, ``row``), as errors
    name it."""
    return {"file": file, "record": record, **({unit: record + 1} if record is not None and unit != "record" else {})}


class MultiReader(Reader):
    """Several input kinds in one dataset: each file goes to the reader whose suffix it has."""

    name = "multi"

    def __init__(self, *, readers: list[Reader]) -> None:
        self.readers = readers
        self.suffixes = tuple(s for r in readers for s in r.suffixes)  # type: ignore[misc]

    def reader_for(self, file: InputFile) -> Reader:
        lower = file.path.lower()
        return next(r for r in self.readers if lower.endswith(r.suffixes))

    def limit_records(self, max_bytes: int) -> None:
        for r in self.readers:
            r.limit_records(max_bytes)

    def kinds(self, files: list[InputFile]) -> list[str]:
        return sorted({self.reader_for(f).name for f in files})

    def plan(self, files: list[InputFile], *, chunk_bytes: int) -> list[Task]:
        tasks: list[Task] = []
        for f in files:
            for t in self.reader_for(f).plan([f], chunk_bytes=chunk_bytes):
                tasks.append(Task(index=len(tasks), file=f, start=t.start, stop=t.stop,
                                  first_record=t.first_record, nbytes=t.nbytes))
        return tasks

    def unit_for(self, file: InputFile) -> str:
        return self.reader_for(file).unit_for(file)

    def expected_tasks(self, file: InputFile, *, chunk_bytes: int) -> int | None:
        return self.reader_for(file).expected_tasks(file, chunk_bytes=chunk_bytes)

    def reads_to_check(self, file: InputFile) -> bool:
        return self.reader_for(file).reads_to_check(file)

    def reads_to_plan(self, file: InputFile, *, chunk_bytes: int) -> bool:
        return self.reader_for(file).reads_to_plan(file, chunk_bytes=chunk_bytes)

    @property
    def plans_each_file(self) -> bool:
        return all(r.plans_each_file for r in self.readers)

    def describe(self, task: Task, record: int) -> tuple[str, int | None]:
        return self.reader_for(task.file).describe(task, record)

    def identities(self, task: Task, records: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
        return self.reader_for(task.file).identities(task, records)

    def read(self, task: Task) -> Iterator[tuple[int, Any | BadRecord]]:
        return self.reader_for(task.file).read(task)

    def record_offsets(self, task: Task, records: np.ndarray) -> np.ndarray | None:
        return self.reader_for(task.file).record_offsets(task, records)
