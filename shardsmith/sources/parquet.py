"""Parquet: one record per row, numbered from 0 per file; one task per row group.

As samples, a row's columns are its fields, typed as pyarrow gives them (binary columns as bytes):
the format decides how they are written (webdataset: each binary column a member, the rest one
``json`` member; ``check`` makes sure before any work that the binary columns name distinct members).
Read as events (``--to hdf5``, ``--group-by``) the same files go to the ``parquet-events`` source.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shardsmith.core.field_names import safe_name
from shardsmith.core.input_file import InputFile
from shardsmith.core.text_field import no_text_column
from shardsmith.errors import DataError, UsageError
from shardsmith.kit.reader import BadRecord, Reader, Task
from shardsmith.kit.sample import OTHER_FIELDS


class ParquetReader(Reader):
    name = "parquet"
    suffixes = (".parquet", ".pq")
    unit = "row"
    holds = "rows"
    events_variant = "parquet-events"

    def __init__(self, *, columns: list[str] | None = None, text_field: str | None = None) -> None:
        self.columns = columns
        self.text_field = text_field  # the one column read for --text-field: a missing one names the option

    @classmethod
    def for_text(cls, field: str) -> ParquetReader:
        return cls(columns=[field], text_field=field)

    @classmethod
    def wants_events(cls, opts: Any) -> bool:
        return bool(opts.group_by or opts.events_table)

    def sample_fields(self, value: Any) -> dict[str, Any]:
        """The row's columns, in the file's order (``read`` gives the row as a dict of them)."""
        return value  # type: ignore[no-any-return]

    def sample_schema(self, opts: Any) -> dict[str, Any]:
        return {OTHER_FIELDS: {"kind": "json"}, "binary columns": {"kind": "bytes", "ext": "column name"}}

    def arrow_types(self, files: list[InputFile]) -> Any:
        """The columns read, as the files store them (``check`` made sure every file has the same)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not files:
            return None
        schema = pq.read_schema(files[0].path).remove_metadata()
        return schema if self.columns is None else pa.schema([schema.field(c) for c in self.columns
                                                              if c in schema.names])

    def check(self, files: list[InputFile], opts: Any) -> None:
        """Every file has the same columns, and they make distinct, short member names."""
        check_columns(files, opts.text_field)

    def plan_file(self, file: InputFile, *, chunk_bytes: int) -> list[tuple[int, int, int]]:
        meta = _open(file).metadata
        cuts, first = [], 0
        for i in range(meta.num_row_groups):
            rows = meta.row_group(i).num_rows
            cuts.append((i, i + 1, first))
            first += rows
        return cuts or [(0, 0, 0)]

    def read(self, task: Task) -> Iterator[tuple[int, Any | BadRecord]]:
        pf = _open(task.file)
        if task.stop <= task.start:
            return
        names = pf.schema_arrow.names
        missing = [c for c in self.columns or [] if c not in names]
        if missing:
            reason = (no_text_column(missing[0], names) if missing[0] == self.text_field
                      else f"no column {missing[0]!r} (columns: {', '.join(names)})")
            raise DataError(file=task.file.rel, reason=reason)
        try:
            table = pf.read_row_group(task.start, columns=self.columns)
        except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for corrupt pages
            raise DataError(file=task.file.rel, reason=f"cannot read row group {task.start}: {exc}") from None
        for i, row in enumerate(table.to_pylist()):
            yield task.first_record + i, row


def _open(file: InputFile) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file.path)
    except Exception as exc:
        raise DataError(file=file.rel, reason=f"not a readable Parquet file: {exc}") from None


def check_columns(files: list[InputFile], text_field: str | None) -> None:
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
        ext = safe_name(name)
        if ext in taken:
            raise UsageError(f"{first[0]}: binary column {name!r} would be the member .{ext}, as {taken[ext]} is; "
                             f"rename it")
        if len(ext.encode()) > 30:
            raise UsageError(f"{first[0]}: binary column {name!r} makes a member name longer than tar allows "
                             f"(30 bytes for the extension); rename it")
        taken[ext] = f"column {name!r}"
