"""``ParquetEventReader``: the schema of a set of files, tasks cut at row groups (and event starts
in the long layout), and each task read in record batches of bounded decoded size."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema
from shardsmith.core.input_file import InputFile
from shardsmith.errors import DataError, UsageError
from shardsmith.kit.reader import Reader, StreamError, Task
from shardsmith.sources.parquet_events.arrays import _check_grouped, _columns, _first_null, _key_values
from shardsmith.sources.parquet_events.fields import (
    ROWS_COUNTER,
    _difference,
    _Layout,
    _Leaf,
    _unique_counters,
    _walk,
)
from shardsmith.sources.parquet_events.files import _decoded_bytes, _open, _open_path
from shardsmith.sources.parquet_events.join import _Join, _key_range


class ParquetEventReader(Reader):
    """Physics events from Parquet, wide (a row per event) or long (rows grouped by ``group_by``)."""

    name = "parquet-events"
    suffixes = (".parquet", ".pq")
    unit = "event"
    holds = "events"
    columnar = True

    @classmethod
    def from_options(cls, opts: Any) -> ParquetEventReader:
        if opts.tree:
            raise UsageError("--tree applies to ROOT files")
        if opts.events_table and not opts.group_by:
            raise UsageError("--events-table joins per-event columns on --group-by; give both")
        return cls(columns=list(opts.branches) if opts.branches else None, group_by=opts.group_by,
                   events_table=opts.events_table, step_bytes=opts.step_size)

    def source_fields(self, opts: Any) -> dict[str, Any]:
        return {"group_by": self.group_by}

    def provenance_entry(self) -> str:
        return "row" if self.group_by is None else "first row of the event's group"

    def extra_inputs(self, opts: Any) -> tuple[str | None, ...]:
        return (self.events_table,)

    def __init__(self, *, columns: list[str] | None = None, group_by: str | None = None,
                 events_table: str | None = None, step_bytes: int = 64 << 20) -> None:
        if events_table is not None and group_by is None:
            raise UsageError("an events table joins on a key: give --group-by with it")
        if events_table is not None and not os.path.isfile(events_table):
            raise UsageError(f"{events_table}: no such events table")
        if step_bytes <= 0:
            raise UsageError(f"step size must be positive, got {step_bytes}")
        self.columns = list(columns) if columns else None
        self.group_by = group_by
        self.events_table = None if events_table is None else str(events_table)
        self.step_bytes = int(step_bytes)
        self._layout: _Layout | None = None  # set by ``schema``; every file read must match it

    # -- schema -----------------------------------------------------------------------------

    def schema(self, files: list[InputFile]) -> tuple[EventSchema, list[str]]:
        """The fields every file gives and the names skipped as non-numeric; all files must agree."""
        if not files:
            raise UsageError("no Parquet files to read")
        first: tuple[InputFile, _Layout] | None = None
        for f in files:
            layout = self._resolve(f, _open(f).schema_arrow)
            if first is None:
                first = (f, layout)
            elif layout != first[1]:
                raise DataError(file=f.rel, reason=f"its columns differ from those of {first[0].rel} "
                                                   f"({_difference(layout, first[1])}); convert files of one "
                                                   "schema at a time")
        assert first is not None
        self._layout = first[1]
        return first[1].schema(), list(first[1].skipped)

    def _resolve(self, file: InputFile, arrow_schema: Any) -> _Layout:
        import pyarrow as pa

        names = list(arrow_schema.names)
        key = self.group_by
        leaves: list[_Leaf] = []
        skipped: list[str] = []
        if key is not None:
            if key not in names:
                raise UsageError(f"{file.rel}: --group-by {key!r}: no such column (columns: {', '.join(names)})")
            if not pa.types.is_integer(arrow_schema.field(key).type):
                raise DataError(file=file.rel, reason=f"the group-by column {key!r} is "
                                                      f"{arrow_schema.field(key).type}; it must be an integer")
        for fld in arrow_schema:
            if fld.name == key:
                continue
            counter = ROWS_COUNTER if key is not None else None
            _walk(fld.type, fld.name, fld.name, (), counter=counter, lists_ok=key is None,
                  leaves=leaves, skipped=skipped)
        joined: list[_Leaf] = []
        if self.events_table is not None:
            assert key is not None
            table_schema = _open_path(self.events_table).schema_arrow
            if key not in table_schema.names or not pa.types.is_integer(table_schema.field(key).type):
                raise DataError(file=self.events_table, reason=f"the events table needs an integer column {key!r} "
                                                               f"(columns: {', '.join(table_schema.names)})")
            for fld in table_schema:
                if fld.name != key:
                    _walk(fld.type, fld.name, fld.name, (), counter=None, lists_ok=False,
                          leaves=joined, skipped=skipped)
            names += [n for n in table_schema.names if n not in names]
        leaves, joined, skipped = self._select(file, names, leaves, joined, skipped)
        if not leaves and not joined and key is None:
            raise DataError(file=file.rel, reason=f"no numeric columns to read (skipped: {', '.join(skipped) or '-'})")
        taken = {key} if key else set()
        for leaf in (*leaves, *joined):
            if leaf.field.name in taken:
                where = self.events_table if leaf in joined else file.rel
                raise DataError(file=where, reason=f"two fields named {leaf.field.name!r}; pick one with --columns")
            taken.add(leaf.field.name)
        leaves = _unique_counters(leaves, taken)
        return _Layout(leaves=tuple(leaves), joined=tuple(joined), skipped=tuple(skipped), key=key)

    def _select(self, file: InputFile, names: list[str], leaves: list[_Leaf], joined: list[_Leaf],
                skipped: list[str]) -> tuple[list[_Leaf], list[_Leaf], list[str]]:
        """Keep what ``columns`` asks for; a glob that matches nothing is an error that lists the columns."""
        if self.columns is None:
            return leaves, joined, skipped

        def wanted(name: str, column: str) -> bool:
            return any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(column, g) for g in self.columns or [])

        every = [(leaf.field.name, leaf.column) for leaf in (*leaves, *joined)] + \
                [(s, s.split(".", 1)[0]) for s in skipped]
        for g in self.columns:
            if not any(fnmatch.fnmatchcase(n, g) or fnmatch.fnmatchcase(c, g) for n, c in every):
                raise UsageError(f"{file.rel}: --columns {g!r} matches no column (columns: {', '.join(names)})")
        return ([leaf for leaf in leaves if wanted(leaf.field.name, leaf.column)],
                [leaf for leaf in joined if wanted(leaf.field.name, leaf.column)],
                [s for s in skipped if wanted(s, s.split(".", 1)[0])])

    def _layout_of(self, file: InputFile, pf: Any) -> _Layout:
        layout = self._resolve(file, pf.schema_arrow)
        if self._layout is not None and layout != self._layout:
            raise DataError(file=file.rel, reason=f"its columns differ from those of the other files "
                                                  f"({_difference(layout, self._layout)})")
        return layout

    # -- planning ---------------------------------------------------------------------------

    def plan_file(self, file: InputFile, *, chunk_bytes: int) -> list[tuple[int, int, int]]:
        """Row ranges ``(start, stop, first record)`` of about ``chunk_bytes`` (decoded), cut at
        row-group starts; in the long layout each cut moves on to the next event's first row."""
        pf = _open(file)
        meta = pf.metadata
        total = meta.num_rows
        if total == 0:
            return [(0, 0, 0)]
        cuts, row, acc = [0], 0, 0
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            row += rg.num_rows
            acc += _decoded_bytes(rg, None)
            if acc >= chunk_bytes and row < total:
                cuts.append(row)
                acc = 0
        if self.group_by is None:
            return [(a, b, a) for a, b in zip(cuts, [*cuts[1:], total])]
        starts, scanned = self._event_starts(file, pf)
        ordinals = np.searchsorted(starts, [c for c in cuts if c < scanned], side="left")
        firsts = sorted({int(o) for o in ordinals if o < len(starts)})
        if not firsts:
            return [(0, total, 0)]
        rows = [int(starts[o]) for o in firsts]  # firsts[0] is 0: the first row starts an event
        return [(a, b, o) for a, b, o in zip(rows, [*rows[1:], total], firsts)]

    def _event_starts(self, file: InputFile, pf: Any) -> tuple[np.ndarray, int]:
        """The first row of every event, and how many rows were scanned (up to an unreadable row group,
        which ``read`` then reports); a key that comes back after other keys is an error."""
        key = self.group_by
        assert key is not None
        starts: list[np.ndarray] = []
        keys: list[np.ndarray] = []
        row, prev = 0, None
        for i in range(pf.metadata.num_row_groups):
            try:
                col = pf.read_row_group(i, columns=[key]).column(0).combine_chunks()
            except Exception:  # noqa: BLE001 - a corrupt row group: read() reports it as a StreamError
                break
            null = _first_null(col)
            if null is not None:
                raise DataError(file=file.rel, record=row + null, unit="row", reason=f"the key {key!r} is null")
            k = col.to_numpy(zero_copy_only=False)
            b = np.flatnonzero(k[1:] != k[:-1]) + 1
            if len(k) and (prev is None or k[0] != prev):
                b = np.concatenate(([0], b))
            starts.append(b + row)
            keys.append(k[b])
            if len(k):
                prev = k[-1]
            row += len(k)
        all_starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        _check_grouped(file, key, np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64), all_starts)
        return all_starts.astype(np.int64), row

    # -- reading ----------------------------------------------------------------------------

    def read(self, task: Task) -> Iterator[EventChunk | StreamError]:  # type: ignore[override]
        pf = _open(task.file)
        layout = self._layout_of(task.file, pf)
        total = pf.metadata.num_rows
        stop = total if task.stop < 0 else min(task.stop, total)
        if stop <= task.start:
            return
        pieces = self._pieces(pf, task.start, stop, layout.columns)
        if layout.key is None:
            yield from self._wide(task, layout, pieces)
        else:
            yield from self._long(task, pf, stop, layout, pieces)

    def _pieces(self, pf: Any, start: int, stop: int, columns: list[str]) -> Iterator[tuple[int, Any] | StreamError]:
        """``(first row, record batch)`` of about ``step_bytes`` each over rows [start, stop), row group by row
        group; a ``StreamError`` (and nothing after it) when a row group cannot be read."""
        meta = pf.metadata
        row = 0
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            lo, hi = row, row + rg.num_rows
            row = hi
            if hi <= start or lo == hi:
                continue
            if lo >= stop:
                return
            size = max(1, int(self.step_bytes * rg.num_rows / max(_decoded_bytes(rg, columns), 1)))
            if stop < hi:  # decode no further than needed: the next task reads the rest of this row group
                size = min(size, stop - lo)
            at = lo
            try:
                for batch in pf.iter_batches(batch_size=size, row_groups=[i], columns=columns, use_threads=True):
                    b_lo, at = at, at + batch.num_rows
                    if at <= start:
                        continue
                    a, b = max(start, b_lo) - b_lo, min(stop, at) - b_lo
                    yield b_lo + a, (batch if (a, b) == (0, batch.num_rows) else batch.slice(a, b - a))
                    if at >= stop:
                        return
            except Exception as exc:  # noqa: BLE001 - pyarrow raises OSError/ArrowInvalid for corrupt pages
                yield StreamError(f"cannot read row group {i} (rows {lo + 1}-{hi}): {exc}")
                return

    def _wide(self, task: Task, layout: _Layout, pieces: Iterator[Any]) -> Iterator[EventChunk | StreamError]:
        for piece in pieces:
            if isinstance(piece, StreamError):
                yield piece
                return
            row0, batch = piece
            columns, offsets = _columns(batch, layout.leaves, task.file.rel, row0)
            yield EventChunk(first=row0, n=batch.num_rows, columns=columns, offsets=offsets)

    def _long(self, task: Task, pf: Any, stop: int, layout: _Layout,
              pieces: Iterator[Any]) -> Iterator[EventChunk | StreamError]:
        """Events whole: rows of the event still open at the end of a batch wait for the next batch."""
        key, rel = layout.key, task.file.rel
        assert key is not None
        join = _Join(self.events_table, key, layout.joined, _key_range(pf, key, task.start, stop)) \
            if layout.joined else None
        first = task.first_record
        open_key: int | None = None
        open_parts: list[dict[str, np.ndarray]] = []  # rows of the open event, batch by batch

        open_row = 0  # the open event's first row in the file

        def emit(event_keys: np.ndarray, starts: np.ndarray, rows: int, cols: dict[str, np.ndarray],
                 first_rows: np.ndarray) -> EventChunk:
            offsets = np.empty(len(starts) + 1, dtype=np.int64)
            offsets[:-1], offsets[-1] = starts, rows
            columns = {key: event_keys.astype(np.int64, copy=False), **cols}
            if join is not None:
                columns.update(join.take(event_keys, rel, first))
            return EventChunk(first=first, n=len(starts), columns=columns, offsets={ROWS_COUNTER: offsets},
                              entries=first_rows)

        def close() -> EventChunk:
            cols = {n: np.concatenate([p[n] for p in open_parts]) for n in open_parts[0]}
            rows = sum(len(p[key]) for p in open_parts)
            return emit(np.array([open_key], dtype=np.int64), np.zeros(1, dtype=np.int64), rows,
                        {n: c for n, c in cols.items() if n != key}, np.array([open_row], dtype=np.int64))

        for piece in pieces:
            if isinstance(piece, StreamError):
                yield piece  # the open event may continue in the unread rows: it is part of the unread tail
                return
            row0, batch = piece
            k = _key_values(batch, key, rel, row0)
            cols, _ = _columns(batch, layout.leaves, rel, row0, key_values=k, key=key)
            cols[key] = k
            starts = np.flatnonzero(k[1:] != k[:-1]) + 1
            if open_key is None or k[0] != open_key:
                starts = np.concatenate(([0], starts)).astype(np.int64)
            if open_key is not None:
                head = int(starts[0]) if len(starts) else len(k)
                open_parts.append({n: c[:head] for n, c in cols.items()})
                if not len(starts):
                    continue
                yield close()
                first += 1
            s0, last = int(starts[0]), int(starts[-1])
            if len(starts) > 1:
                body = {n: c[s0:last] for n, c in cols.items() if n != key}
                yield emit(k[starts[:-1]], starts[:-1] - s0, last - s0, body, row0 + starts[:-1])
                first += len(starts) - 1
            open_key, open_parts, open_row = int(k[last]), [{n: c[last:] for n, c in cols.items()}], row0 + last
        if open_key is not None:
            yield close()
