"""Parquet: one record per row, numbered from 0 per file; one task per row group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shardsmith.engine.inputs import InputFile
from shardsmith.errors import DataError
from shardsmith.sources.base import BadRecord, Reader, Task


class ParquetReader(Reader):
    name = "parquet"
    suffixes = (".parquet", ".pq")
    unit = "row"

    def __init__(self, *, columns: list[str] | None = None) -> None:
        self.columns = columns

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
            raise DataError(file=task.file.rel, reason=f"no column {missing[0]!r} (columns: {', '.join(names)})")
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
