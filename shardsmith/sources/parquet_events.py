"""Parquet event files as columnar ``EventChunk``s: one row per event, or rows grouped into events by a key.

Two layouts, chosen by ``group_by``:

* **wide** (no ``group_by``): a row is an event; its record number is the row. Numeric and bool
  columns are fixed fields, fixed-size lists fixed shapes, structs dotted fields (``met.pt``), and a
  ``list``/``large_list`` column of numbers a ragged field. Counter groups come from the schema,
  never from the data: every list column is one group ``n_<column>``, shared by the members of a
  list of structs (``jets: list<struct<pt, eta>>`` → ``jets.pt``, ``jets.eta`` counted by
  ``n_jets``). Two separate list columns whose lengths happen to agree still get a group each, so
  every file and row group gives the same schema, whatever its data.
* **long** (``group_by="event_id"``, the IceCube Kaggle ``batch_*.parquet`` layout): a row is a
  hit; consecutive rows with one key form an event, numbered by its ordinal in the file. The key
  becomes a fixed int64 field, every other numeric column a ragged field of the one group
  ``n_rows`` (rows per event), and ``events_table`` (``train_meta.parquet``) adds its per-event
  columns, joined on the key, as fixed fields. The file must be grouped by the key (sorted is the
  usual case): planning reads the key column once, cuts tasks on event boundaries and rejects a
  key that comes back after other keys.

``columns`` globs match a field's name (``jets.pt``) or its top-level column (``jets``). Strings,
binary, timestamps, lists of lists and other non-numeric columns are skipped and listed. A null
in a numeric column is a ``DataError`` naming the file and row: no silent fill value.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema, Field
from shardsmith.engine.inputs import InputFile
from shardsmith.errors import DataError, UsageError
from shardsmith.sources.base import Reader, StreamError, Task

ROWS_COUNTER = "n_rows"  # the counter of the long layout: rows (hits, pulses) per event
_LIST = "[]"  # a leaf's path step into a list's elements


@dataclass(frozen=True, slots=True)
class _Leaf:
    """One output field and where its values sit in an Arrow column."""

    field: Field
    column: str  # the top-level column holding it
    steps: tuple[str, ...] = ()  # struct children to descend into, ``_LIST`` for a list level


@dataclass(frozen=True, slots=True)
class _Layout:
    """What one file gives: fields from its columns, fields joined from the events table, names skipped."""

    leaves: tuple[_Leaf, ...]
    joined: tuple[_Leaf, ...]
    skipped: tuple[str, ...]
    key: str | None

    @property
    def columns(self) -> list[str]:
        """Top-level columns to read from an input file (the key first)."""
        return list(dict.fromkeys([*([self.key] if self.key else []), *(leaf.column for leaf in self.leaves)]))

    @property
    def joined_columns(self) -> list[str]:
        return list(dict.fromkeys(leaf.column for leaf in self.joined))

    def schema(self) -> EventSchema:
        key = [Field(name=self.key, dtype="<i8")] if self.key else []
        return EventSchema(tuple(key + [leaf.field for leaf in (*self.leaves, *self.joined)]))


class _Null(Exception):
    """A null where a number must be, at this row of the batch."""

    def __init__(self, row: int) -> None:
        self.row = row


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

        def emit(event_keys: np.ndarray, starts: np.ndarray, rows: int, cols: dict[str, np.ndarray]) -> EventChunk:
            offsets = np.empty(len(starts) + 1, dtype=np.int64)
            offsets[:-1], offsets[-1] = starts, rows
            columns = {key: event_keys.astype(np.int64, copy=False), **cols}
            if join is not None:
                columns.update(join.take(event_keys, rel, first))
            return EventChunk(first=first, n=len(starts), columns=columns, offsets={ROWS_COUNTER: offsets})

        def close() -> EventChunk:
            cols = {n: np.concatenate([p[n] for p in open_parts]) for n in open_parts[0]}
            rows = sum(len(p[key]) for p in open_parts)
            return emit(np.array([open_key], dtype=np.int64), np.zeros(1, dtype=np.int64), rows,
                        {n: c for n, c in cols.items() if n != key})

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
                yield emit(k[starts[:-1]], starts[:-1] - s0, last - s0, body)
                first += len(starts) - 1
            open_key, open_parts = int(k[last]), [{n: c[last:] for n, c in cols.items()}]
        if open_key is not None:
            yield close()


# -- Arrow types to fields ------------------------------------------------------------------

def _numeric(t: Any) -> tuple[str, tuple[int, ...]] | None:
    """(numpy dtype, inner shape) of a number or a (nested) fixed-size list of numbers, else None."""
    import pyarrow as pa

    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.dtype(t.to_pandas_dtype()).str, tuple(shape)
    return None


def _walk(t: Any, name: str, column: str, steps: tuple[str, ...], *, counter: str | None, lists_ok: bool,
          leaves: list[_Leaf], skipped: list[str]) -> None:
    """The fields of one Arrow type: structs give dotted names, one list level a ragged group."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        for child in t:
            _walk(child.type, f"{name}.{child.name}", column, (*steps, child.name), counter=counter,
                  lists_ok=lists_ok, leaves=leaves, skipped=skipped)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        if not lists_ok:
            skipped.append(name)  # a list inside a ragged group would be ragged twice
            return
        _walk(t.value_type, name, column, (*steps, _LIST), counter=f"n_{name}", lists_ok=False,
              leaves=leaves, skipped=skipped)
    elif (kind := _numeric(t)) is not None:
        leaves.append(_Leaf(field=Field(name=name, dtype=kind[0], shape=kind[1], counter=counter),
                            column=column, steps=steps))
    else:
        skipped.append(name)


def _unique_counters(leaves: list[_Leaf], taken: set[str]) -> list[_Leaf]:
    """Counter names that are not also field names (``n_x`` → ``n_x_`` when a field ``n_x`` exists)."""
    rename: dict[str, str] = {}
    for leaf in leaves:
        c = leaf.field.counter
        if c is not None and c not in rename:
            new = c
            while new in taken or new in rename.values():
                new += "_"
            rename[c] = new
    out = []
    for leaf in leaves:
        c = leaf.field.counter
        if c is not None and rename[c] != c:
            f = leaf.field
            leaf = _Leaf(field=Field(name=f.name, dtype=f.dtype, shape=f.shape, counter=rename[c]),
                         column=leaf.column, steps=leaf.steps)
        out.append(leaf)
    return out


def _difference(a: _Layout, b: _Layout) -> str:
    """The first way two layouts differ, in words."""
    fa = {leaf.field.name: leaf.field for leaf in (*a.leaves, *a.joined)}
    fb = {leaf.field.name: leaf.field for leaf in (*b.leaves, *b.joined)}
    for name in fb:
        if name not in fa:
            return f"no column {name!r}"
    for name in fa:
        if name not in fb:
            return f"an extra column {name!r}"
    for name, f in fa.items():
        if f != fb[name]:
            return f"column {name!r} is {_kind(f)} here, {_kind(fb[name])} there"
    if a.skipped != b.skipped:
        return f"skipped columns {', '.join(a.skipped) or '-'} here, {', '.join(b.skipped) or '-'} there"
    return "the column order differs"


def _kind(f: Field) -> str:
    return f"{f.dtype}{list(f.shape) if f.shape else ''}{' ragged' if f.ragged else ''}"


# -- Arrow arrays to numpy ------------------------------------------------------------------

def _first_null(arr: Any) -> int | None:
    if arr.null_count == 0:
        return None
    import pyarrow.compute as pc

    return int(np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))[0])


def _extract(column: Any, leaf: _Leaf, lists: dict[tuple[str, ...], tuple[Any, np.ndarray]]
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """A leaf's values (zero copy where Arrow allows) and its list offsets from 0; raises ``_Null``."""
    arr, offsets = column, None

    def null_row(index: int | None, per: int = 1) -> None:
        if index is not None:
            item = index // per
            raise _Null(item if offsets is None else int(np.searchsorted(offsets, item, side="right")) - 1)

    for i, step in enumerate(leaf.steps):
        null_row(_first_null(arr))
        if step == _LIST:
            here = (leaf.column, *leaf.steps[:i + 1])
            if here not in lists:
                off = arr.offsets.to_numpy()
                base, end = int(off[0]), int(off[-1])
                lists[here] = (arr.values.slice(base, end - base), off.astype(np.int64) - base)
            arr, offsets = lists[here]
        else:
            arr = arr.field(step)
    per = 1
    for size in leaf.field.shape:
        null_row(_first_null(arr), per)
        arr = arr.flatten()
        per *= size
    null_row(_first_null(arr), per)
    values = arr.to_numpy(zero_copy_only=False)
    return values.reshape(-1, *leaf.field.shape), offsets


def _columns(batch: Any, leaves: tuple[_Leaf, ...], rel: str, row0: int, *, key_values: np.ndarray | None = None,
             key: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every leaf of one record batch as numpy, and the offsets of each ragged group."""
    columns: dict[str, np.ndarray] = {}
    offsets: dict[str, np.ndarray] = {}
    lists: dict[tuple[str, ...], tuple[Any, np.ndarray]] = {}
    for leaf in leaves:
        try:
            values, off = _extract(batch.column(leaf.column), leaf, lists)
        except _Null as null:
            where = f" ({key} {int(key_values[null.row])})" if key_values is not None else ""
            raise DataError(file=rel, record=row0 + null.row, unit="row",
                            reason=f"column {leaf.field.name!r} holds a null{where}; numeric fields must not "
                                   "(fill or drop them before converting)") from None
        columns[leaf.field.name] = values
        if off is not None:
            offsets.setdefault(leaf.field.counter, off)  # type: ignore[arg-type]
    return columns, offsets


def _key_values(batch: Any, key: str, rel: str, row0: int) -> np.ndarray:
    col = batch.column(key)
    null = _first_null(col)
    if null is not None:
        raise DataError(file=rel, record=row0 + null, unit="row", reason=f"the key {key!r} is null")
    return col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _check_grouped(file: InputFile, key: str, run_keys: np.ndarray, run_starts: np.ndarray) -> None:
    """Each key forms one run of rows; else name the row where a key comes back."""
    if len(run_keys) < 2 or np.all(run_keys[1:] > run_keys[:-1]):
        return
    order = np.argsort(run_keys, kind="stable")
    ranked = run_keys[order]
    again = np.flatnonzero(ranked[1:] == ranked[:-1]) + 1
    if not len(again):
        return
    j = int(order[again].min())  # the first run, in file order, whose key was seen before
    before = int(np.flatnonzero(run_keys[:j] == run_keys[j])[0])
    raise DataError(file=file.rel, record=int(run_starts[j]), unit="row",
                    reason=f"{key} {int(run_keys[j])} comes back here after other keys (first seen at row "
                           f"{int(run_starts[before]) + 1}); the file must be sorted or grouped by {key}")


_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def _decoded_bytes(rg: Any, columns: list[str] | None) -> int:
    """About how many bytes a row group's ``columns`` (all if None) take once decoded: values times their
    width. ``total_byte_size`` would not do: it counts the encoded pages, a few bytes for a run of repeats."""
    total = 0
    for j in range(rg.num_columns):
        c = rg.column(j)
        path = c.path_in_schema
        if columns is not None and not any(path == n or path.startswith(n + ".") for n in columns):
            continue
        width = _WIDTH.get(c.physical_type)
        total += c.num_values * width if width else c.total_uncompressed_size
    return total


# -- the events table -----------------------------------------------------------------------

def _key_range(pf: Any, key: str, start: int, stop: int) -> tuple[int, int] | None:
    """Smallest and largest key in rows [start, stop), from row-group statistics; None without them."""
    meta = pf.metadata
    index = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == key), None)
    if index is None:
        return None
    lo = hi = None
    row = 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        a, row = row, row + rg.num_rows
        if row <= start or a >= stop or rg.num_rows == 0:
            continue
        stats = rg.column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        lo = stats.min if lo is None else min(lo, stats.min)
        hi = stats.max if hi is None else max(hi, stats.max)
    return None if lo is None else (int(lo), int(hi))  # type: ignore[arg-type]


class _Join:
    """Per-event columns of the events table for one task's key range, looked up by key."""

    def __init__(self, path: str | None, key: str, leaves: tuple[_Leaf, ...], span: tuple[int, int] | None) -> None:
        import pyarrow.parquet as pq

        assert path is not None
        self.path, self.key = path, key
        filters = None if span is None else [(key, ">=", span[0]), (key, "<=", span[1])]
        columns = list(dict.fromkeys([key, *(leaf.column for leaf in leaves)]))
        try:
            table = pq.read_table(path, columns=columns, filters=filters).combine_chunks()
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors for an unreadable file
            raise DataError(file=path, reason=f"cannot read the events table: {exc}") from None
        batch = table.to_batches()[0] if table.num_rows else None
        if batch is None:
            self.keys = np.zeros(0, dtype=np.int64)
            self.columns = {leaf.field.name: np.zeros((0, *leaf.field.shape), leaf.field.dtype) for leaf in leaves}
            return
        keys = _key_values(batch, key, path, 0)
        cols, _ = _columns(batch, leaves, path, 0, key_values=keys, key=key)
        if not np.all(keys[1:] > keys[:-1]):
            order = np.argsort(keys, kind="stable")
            keys = keys[order]
            cols = {n: c[order] for n, c in cols.items()}
            twice = np.flatnonzero(keys[1:] == keys[:-1])
            if len(twice):
                raise DataError(file=path, reason=f"{key} {int(keys[twice[0]])} appears more than once in the "
                                                  "events table")
        self.keys, self.columns = keys, cols

    def take(self, event_keys: np.ndarray, rel: str, first: int) -> dict[str, np.ndarray]:
        at = np.searchsorted(self.keys, event_keys)
        found = at < len(self.keys)
        found[found] = self.keys[at[found]] == event_keys[found]
        if not found.all():
            i = int(np.flatnonzero(~found)[0])
            raise DataError(file=rel, record=first + i, unit="event",
                            reason=f"{self.key} {int(event_keys[i])} is not in the events table "
                                   f"{os.path.basename(self.path)}")
        return {n: c[at] for n, c in self.columns.items()}


# -- opening files --------------------------------------------------------------------------

def _open(file: InputFile) -> Any:
    return _open_path(file.path, file.rel)


def _open_path(path: str, rel: str | None = None) -> Any:
    import pyarrow.parquet as pq

    try:  # pages written with checksums are verified: a flipped byte is an error, not silent garbage
        return pq.ParquetFile(path, page_checksum_verification=True)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a file that is not (whole) Parquet
        raise DataError(file=rel or path, reason=f"not a readable Parquet file: {exc}") from None
