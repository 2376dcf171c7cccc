"""CSV and TSV files as a shardsmith source: the worked example of a plugin (see README.md).

Registered through the ``shardsmith.sources`` entry point group as ``csv``. One record per data
row, numbered from 0 in each file (the header row names the fields and is not a record; blank
lines are not records either), read with Python's ``csv`` module: comma-separated for ``.csv``,
tab-separated for ``.tsv``, either optionally gzip-compressed. A row is a dict of strings; a row
with another number of fields than the header, a malformed quote or invalid UTF-8 is a bad record
(``--on-error skip`` skips and counts it; otherwise the run stops naming the file and the row).

How a big file is split between workers, and why it is correct: a quoted field may hold line
breaks, so a cut at just any newline could land inside a record. The planner therefore parses the
file with the very generator the reader uses (``_records``) and cuts only where that parse has
just finished a record, after about ``chunk_bytes``; it counts the records before each cut on the
way, so record numbers (a sample's identity) never depend on the plan. A task that starts past
the header reads the header first, then seeks to its start: the csv parser holds no state between
records, so parsing from a cut gives exactly the records the whole-file parse gave. Planning
costs one extra parse of each big file; compressed files cannot be entered in the middle and stay
one task each.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterator
from typing import IO, Any

from shardsmith.plugin import (
    OTHER_FIELDS,
    BadRecord,
    DataError,
    InputFile,
    Reader,
    RecordError,
    StreamError,
    Task,
    Transform,
    UsageError,
)

__all__ = ["CsvSource", "NormalizeText"]

_BOM = b"\xef\xbb\xbf"
# csv's own default (128 KiB a field) is far too small for documents; the limit is process-wide, so it is
# raised (never lowered) when parsing starts; rows over --memory's share are refused by their byte size instead
_FIELD_LIMIT = 2**31 - 1


class CsvSource(Reader):
    """A shardsmith source of rows (``holds = "rows"``) from CSV and TSV files."""

    name = "csv"
    suffixes = (".csv", ".tsv", ".csv.gz", ".tsv.gz")
    unit = "row"
    holds = "rows"
    byte_ranges = True

    def __init__(self, *, text_field: str | None = None) -> None:
        self.text_field = text_field  # a column every file must have (pack-tokens reads it)

    @classmethod
    def for_text(cls, field: str) -> CsvSource:
        return cls(text_field=field)

    def check(self, files: list[InputFile], opts: Any) -> None:
        """Every header is readable and names distinct columns, including ``--text-field``: before any work."""
        for f in files:
            try:
                with _open(f.path) as fh:
                    columns = _header(fh, f)
            except (OSError, EOFError) as exc:
                raise UsageError(f"{f.rel}: cannot read: {exc}") from None
            if columns is not None and opts.text_field and opts.text_field not in columns:
                raise UsageError(f"{f.rel}: no column {opts.text_field!r} for --text-field "
                                 f"(columns: {', '.join(columns)})")

    def sample_fields(self, value: Any) -> dict[str, Any]:
        """The row's fields, named by the header, in its order: every value a ``str``, as CSV holds it.
        This is all a source says of a sample; how it is written is the format's (``--to webdataset``:
        one ``json`` member of the columns; ``--to csv``: a row of cells)."""
        return value  # type: ignore[no-any-return]

    def sample_schema(self, opts: Any) -> dict[str, Any]:
        """The header's columns, known only once a file is read (``OTHER_FIELDS``), each a string."""
        return {OTHER_FIELDS: {"kind": "text"}}

    def plan_file(self, file: InputFile, *, chunk_bytes: int) -> list[tuple[int, int, int]]:
        if _compressed(file.path) or file.size <= chunk_bytes:
            return [(0, -1, 0)]
        cuts: list[tuple[int, int, int]] = []
        start = first = record = 0
        with open(file.path, "rb") as fh:
            lines = _Lines(fh, 0, -1)
            records = _records(lines, _delimiter(file.path))
            next(records, None)  # the header
            for _ in records:
                record += 1
                if lines.pos - start >= chunk_bytes:
                    cuts.append((start, lines.pos, first))
                    start, first = lines.pos, record
            if start < lines.pos or not cuts:
                cuts.append((start, lines.pos, first))
        return cuts

    def read(self, task: Task) -> Iterator[tuple[int, Any | BadRecord]]:
        record = task.first_record
        try:
            with _open(task.file.path) as fh:
                columns = _header(fh, task.file)
                if columns is None:
                    return
                if self.text_field is not None and self.text_field not in columns:
                    raise DataError(file=task.file.rel, reason=f"no column {self.text_field!r} "
                                                               f"(columns: {', '.join(columns)})")
                fh.seek(task.start)
                lines = _Lines(fh, task.start, task.stop)
                records = _records(lines, _delimiter(task.file.path))
                if task.start == 0:
                    next(records, None)  # the header, read again as the start of this range
                for value in records:
                    if isinstance(value, str):
                        yield record, BadRecord(value)
                    elif len(value) != len(columns):
                        yield record, BadRecord(f"{len(value)} fields, the header has {len(columns)}")
                    elif self.max_record_bytes is not None and lines.last_size > self.max_record_bytes:
                        yield record, BadRecord(f"a row of {lines.last_size} bytes is longer than the "
                                                f"{self.max_record_bytes} one record may take within --memory")
                    else:
                        yield record, dict(zip(columns, value))
                    record += 1
        except (OSError, EOFError) as exc:  # unreadable, or a truncated or corrupt .gz
            yield record, StreamError(f"cannot read: {exc}")


class _Lines:
    """The lines of a byte range of a file, decoded for ``csv.reader``, counting the bytes handed out.

    ``pos`` is the byte offset after the last line handed out; ``mark()`` starts a record, after
    which ``bad`` says whether one of its lines was not UTF-8 and ``last_size`` how long it is.
    """

    def __init__(self, fh: IO[bytes], start: int, stop: int) -> None:
        self.fh = fh
        self.pos = start
        self.stop = stop
        self.bad: str | None = None
        self.began = start
        self.last_size = 0

    def mark(self) -> None:
        self.bad = None
        self.began = self.pos

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        if 0 <= self.stop <= self.pos:
            raise StopIteration
        line = self.fh.readline()
        if not line:
            raise StopIteration
        at_start = self.pos == 0
        self.pos += len(line)
        self.last_size = self.pos - self.began
        if at_start and line.startswith(_BOM):
            line = line[len(_BOM):]
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.bad = self.bad or f"invalid UTF-8 at byte {self.pos - len(line) + exc.start} of the file"
            return line.decode("utf-8", "surrogateescape")


def _records(lines: _Lines, delimiter: str) -> Iterator[list[str] | str]:
    """Each record of ``lines``: its fields, or (a string) why it is not one. Blank lines are no records.

    The planner and the reader both parse with this, so they agree on where every record ends.
    """
    csv.field_size_limit(_FIELD_LIMIT)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    while True:
        lines.mark()
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # the parser starts afresh at the next line
            yield f"malformed {'TSV' if delimiter == chr(9) else 'CSV'}: {exc}"
            continue
        if lines.bad:
            yield lines.bad
        elif row:
            yield row


def _header(fh: IO[bytes], file: InputFile) -> list[str] | None:
    """The column names of a file (its first non-blank row), or None for a file without one."""
    fh.seek(0)
    header = next(_records(_Lines(fh, 0, -1), _delimiter(file.path)), None)
    if header is None:
        return None
    if isinstance(header, str):
        raise DataError(file=file.rel, reason=f"header row: {header}")
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise DataError(file=file.rel, reason=f"header row: column {name!r} appears twice")
        seen.add(name)
    return header


def _compressed(path: str) -> bool:
    return path.lower().endswith(".gz")


def _delimiter(path: str) -> str:
    return "\t" if path.lower().endswith((".tsv", ".tsv.gz")) else ","


def _open(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if _compressed(path) else open(path, "rb")  # type: ignore[return-value]


class NormalizeText(Transform):
    """The ``normalize`` transform: Unicode NFC and single spaces in one text field of each row
    (``--transform normalize=text``), so the same words make the same tokens whatever their source
    wrote. A row without that field, or with a non-string in it, is a bad record."""

    name = "normalize"
    applies_to = ("rows",)

    def __init__(self, *, field: str) -> None:
        self.field = field

    @classmethod
    def from_spec(cls, spec: str | None, *, opts: Any) -> NormalizeText:
        if not spec:
            raise UsageError("--transform normalize=FIELD: name the text field to normalize")
        return cls(field=spec)

    def apply(self, value: Any, *, identity: str, copy: int) -> dict[str, Any]:
        import unicodedata

        text = value.get(self.field) if isinstance(value, dict) else None
        if not isinstance(text, str):
            raise RecordError(f"no text field {self.field!r} to normalize")
        return {**value, self.field: " ".join(unicodedata.normalize("NFC", text).split())}

    def describe(self) -> dict[str, Any]:
        return {"transform": self.name, "field": self.field}
