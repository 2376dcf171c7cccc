"""Physics events: a schema of fixed and ragged numeric fields, columnar chunks, and their payload.

Readers of event files (ROOT, Parquet) yield ``EventChunk``s: columns for many events at once,
never a Python object per event. The shuffle moves one payload per event, so a chunk is encoded
into per-event records and a sorted batch decoded back into columns, both without a loop per
event. A record is 8-byte aligned throughout::

    [fixed fields, each padded to 8 bytes][one int64 count per ragged group][each ragged field's
    values, padded to 8 bytes]

Ragged fields that share a counter (``NJet`` for ``Jet_pt`` and ``Jet_eta``) form one group and
share one offsets array. These records are the neutral ones, which a format gets unless its encoder
makes its own (``kit/event_codec.py``: ``Format.encoder`` for events; memmap's cut rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsmith.core.dtypes import allowed, safe_dtype
from shardsmith.core.memory import no_gc
from shardsmith.core.ragged import Runs, join, slices, starts_of


def pad8(n: Any) -> Any:
    return (n + 7) // 8 * 8


@dataclass(frozen=True, kw_only=True, slots=True)
class Field:
    """One output field: a numeric dtype, a fixed inner shape, and its counter group if ragged."""

    name: str
    dtype: str  # numpy dtype string, e.g. "<f4"
    shape: tuple[int, ...] = ()
    counter: str | None = None  # ragged: the group sharing one offsets array; None: one value per event

    @property
    def ragged(self) -> bool:
        return self.counter is not None

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def item_bytes(self) -> int:
        """Bytes of one element (one value, or one fixed-shape row of values)."""
        return self.np_dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "ragged": self.ragged}
        if self.counter is not None:
            out["counter"] = self.counter
        return out

    @classmethod
    def from_json(cls, name: str, d: dict[str, Any]) -> Field:
        """A field read from a manifest or a shard: its dtype must pass the allow-list (DatasetError)."""
        safe_dtype(d["dtype"], field=f"schema.{name}.dtype")
        return cls(name=name, dtype=d["dtype"], shape=tuple(d.get("shape", ())), counter=d.get("counter"))


@dataclass(frozen=True, slots=True)
class EventSchema:
    """The fields of every event, in a fixed order (the order of the record layout)."""

    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate field names in {names}")
        for f in self.fields:
            if not allowed(f.np_dtype.newbyteorder("<")):  # any byte order in memory; on disk: from_json
                raise ValueError(f"field {f.name!r}: {f.dtype} is not a numeric dtype")

    @property
    def fixed(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if not f.ragged)

    @property
    def ragged(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.ragged)

    @property
    def counters(self) -> tuple[str, ...]:
        """Ragged groups in order of first appearance."""
        return tuple(dict.fromkeys(f.counter for f in self.ragged))  # type: ignore[misc]

    def members(self, counter: str) -> tuple[Field, ...]:
        return tuple(f for f in self.ragged if f.counter == counter)

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {f.name: f.to_json() for f in self.fields}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EventSchema:
        return cls(tuple(Field.from_json(name, v) for name, v in d.items()))


@dataclass(slots=True)
class EventChunk:
    """Consecutive events of one file, as columns.

    ``columns[name]`` is ``(n, *shape)`` for a fixed field and the flat ``(total, *shape)`` values
    for a ragged one; ``offsets[counter]`` is int64 ``(n + 1,)`` starting at 0. ``first`` is the
    record number (entry) of the first event in its file. ``entries``: where each event starts in
    its file when that is not its record number (events grouped from rows: each one's first row),
    for ``--provenance``; None otherwise.
    """

    first: int
    n: int
    columns: dict[str, np.ndarray]
    offsets: dict[str, np.ndarray] = field(default_factory=dict)
    entries: np.ndarray | None = None

    def counts(self, counter: str) -> np.ndarray:
        return np.diff(self.offsets[counter])

    def event(self, i: int, schema: EventSchema) -> dict[str, np.ndarray]:
        """Event ``i``: each fixed field's row, each ragged field's values."""
        out = {}
        for f in schema.fields:
            col = self.columns[f.name]
            if f.ragged:
                off = self.offsets[f.counter]
                out[f.name] = col[off[i]:off[i + 1]]
            else:
                out[f.name] = col[i]
        return out

    def take(self, index: np.ndarray, schema: EventSchema) -> EventChunk:
        """The events ``index`` (in that order) as a new chunk."""
        index = np.asarray(index, dtype=np.int64)
        columns: dict[str, np.ndarray] = {f.name: self.columns[f.name][index] for f in schema.fixed}
        offsets: dict[str, np.ndarray] = {}
        for c in schema.counters:
            off = self.offsets[c]
            counts = (off[1:] - off[:-1])[index]
            offsets[c] = starts_of(counts)
            if len(index) == 0:
                src = np.zeros(0, dtype=np.int64)
            else:
                src = np.repeat(off[:-1][index] - offsets[c][:-1], counts) + np.arange(offsets[c][-1])
            for f in schema.members(c):
                columns[f.name] = self.columns[f.name][src]
        entries = None if self.entries is None else self.entries[index]
        return EventChunk(first=self.first, n=len(index), columns=columns, offsets=offsets, entries=entries)


def check_chunk(chunk: EventChunk, schema: EventSchema) -> None:
    """The chunk holds every field with its dtype and shape, and offsets that match the values."""
    for c in schema.counters:
        off = chunk.offsets.get(c)
        if off is None or off.shape != (chunk.n + 1,) or (chunk.n >= 0 and len(off) and off[0] != 0):
            raise ValueError(f"counter {c!r}: offsets must be {chunk.n + 1} int64 starting at 0")
    for f in schema.fields:
        col = chunk.columns.get(f.name)
        if col is None:
            raise ValueError(f"field {f.name!r} missing from the chunk")
        rows = int(chunk.offsets[f.counter][-1]) if f.ragged else chunk.n
        if col.shape != (rows, *f.shape):
            raise ValueError(f"field {f.name!r}: shape {col.shape}, expected {(rows, *f.shape)}")


def record_lengths(chunk: EventChunk, schema: EventSchema) -> np.ndarray:
    """Bytes of each event's record."""
    fixed = sum(pad8(f.item_bytes) for f in schema.fixed) + 8 * len(schema.counters)
    lengths = np.full(chunk.n, fixed, dtype=np.int64)
    for f in schema.ragged:
        lengths += pad8(chunk.counts(f.counter) * f.item_bytes)
    return lengths


def encode(chunk: EventChunk, schema: EventSchema, *, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-event records back to back: ``(lengths, payload)``, payload uint8 (8-byte aligned).

    ``lengths`` are in chunk order; the records lie in the payload in ``order`` (event
    ``order[k]`` is the k-th record), so a caller that reorders records (the scatter, by bucket)
    gets them in place without copying the payload once more. The payload is one join of each
    record's pieces (its head row, then each ragged field's values and padding): with hundreds of
    values per event, one slice per piece moves the bytes faster than an index per value."""
    lengths = record_lengths(chunk, schema)
    n = chunk.n
    if order is None:
        order = np.arange(n, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    with no_gc():
        return lengths, _join_records(chunk, schema, order)


def _join_records(chunk: EventChunk, schema: EventSchema, order: np.ndarray) -> np.ndarray:
    return join(record_pieces(chunk, schema, order)[0])


def record_pieces(chunk: EventChunk, schema: EventSchema, order: np.ndarray) -> tuple[list[Any], int]:
    """``encode``'s records ``order`` as the buffers that make them up, in order, and how many
    buffers each record has (the same for every record): the scatter writes them to its part
    file as they are (``PartWriter.add`` takes a list of buffers), with no joined copy in fresh memory first."""
    order = np.asarray(order, dtype=np.int64)
    head = head_rows(chunk, schema)
    columns: list[list[Any]] = [row_slices(head, order)]
    for f in schema.ragged:
        values = _bytes_of(chunk.columns[f.name], f)
        off = chunk.offsets[f.counter] * f.item_bytes
        lo, hi = off[:-1][order], off[1:][order]
        columns.append(slices(values, lo, hi))
        pad = (-(hi - lo)) % 8
        if pad.any():
            columns.append([ZEROS[p] for p in pad.tolist()])
    with no_gc():
        return [piece for pieces in zip(*columns) for piece in pieces], len(columns)


def record_starts(lengths: np.ndarray, payload: np.ndarray | memoryview | bytes,
                  starts: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The payload as 8-byte-aligned bytes, and each record's byte offset in it: ``starts`` as
    given (checked inside the payload and aligned), or the records back to back (their lengths
    must add up to the payload's size)."""
    raw = np.frombuffer(payload, dtype=np.uint8)
    if raw.ctypes.data % 8:
        raw = raw.copy()
    if starts is None:
        ends = starts_of(lengths)
        if int(ends[-1]) != len(raw):
            raise ValueError(f"payload holds {len(raw)} bytes, lengths say {int(ends[-1])}")
        return raw, ends[:-1]
    starts = np.asarray(starts, dtype=np.int64)
    if len(lengths) and (int((starts + lengths).max()) > len(raw) or int(starts.min()) < 0 or np.any(starts % 8)):
        raise ValueError(f"record positions outside the payload's {len(raw)} bytes or not 8-byte aligned")
    return raw, starts


def decode(lengths: np.ndarray, payload: np.ndarray | memoryview | bytes, schema: EventSchema,
           *, first: int = 0, starts: np.ndarray | None = None) -> EventChunk:
    """The inverse of ``encode``: columns of a batch of records, back to back in the payload, or
    (with ``starts``, each record's byte offset) anywhere in it, so a sorted batch is decoded
    straight from the unsorted payload."""
    chunk, runs = decode_heads(lengths, payload, schema, first=first, starts=starts)
    for f in schema.ragged:
        chunk.columns[f.name] = runs[f.name].joined().view(f.np_dtype).reshape(-1, *f.shape)
    return chunk


def decode_heads(lengths: np.ndarray, payload: np.ndarray | memoryview | bytes, schema: EventSchema,
                 *, first: int = 0, starts: np.ndarray | None = None) -> tuple[EventChunk, dict[str, Runs]]:
    """``decode`` without copying the ragged values: the chunk holds the fixed fields and the
    offsets, and each ragged field's values are left where they lie in the payload, as ``Runs``
    (bytes) that a writer copies once, straight into its output."""
    lengths = np.asarray(lengths, dtype=np.int64)
    raw, starts = record_starts(lengths, payload, starts)
    return decode_from([raw], np.zeros(len(lengths), dtype=np.int64), starts, lengths, schema, first=first)


def decode_from(sources: list[np.ndarray], src: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                schema: EventSchema, *, first: int = 0) -> tuple[EventChunk, dict[str, Runs]]:
    """``decode_heads`` of records lying in several payloads: record k at ``starts[k]`` of
    ``sources[src[k]]`` (each source 8-byte aligned, e.g. a part file's mapped pages)."""
    n = len(lengths)
    head_words = sum(pad8(f.item_bytes) for f in schema.fixed) // 8
    width = head_words + len(schema.counters)
    heads = np.empty((n, width), dtype=np.uint64)
    if len(sources) == 1:
        parts: list[tuple[np.ndarray, Any]] = [(sources[0], slice(None))]
    else:  # each source's records, found with one sort (a mask per source would cost n x sources)
        by_source = np.argsort(src, kind="stable")
        bounds = np.searchsorted(src[by_source], np.arange(len(sources) + 1)).tolist()
        parts = [(raw, by_source[a:b]) for raw, a, b in zip(sources, bounds[:-1], bounds[1:])]
    for raw, rows in parts:
        at = starts[rows]
        if not len(at):
            continue
        if raw.ctypes.data % 8 or np.any(at % 8) or int(at.min()) < 0 or \
                int((at + np.maximum(lengths[rows], 8 * width)).max()) > len(raw):
            raise ValueError(f"record positions outside the payload's {len(raw)} bytes or not 8-byte aligned")
        words = raw[: len(raw) // 8 * 8].view(np.uint64)
        heads[rows] = words[(at // 8)[:, None] + np.arange(width)]
    columns: dict[str, np.ndarray] = {}
    if head_words:
        head = heads[:, :head_words].view(np.uint8).reshape(n, 8 * head_words)
        at = 0
        for f in schema.fixed:
            b = f.item_bytes
            columns[f.name] = np.ascontiguousarray(head[:, at:at + b]).view(f.np_dtype).reshape(n, *f.shape)
            at += pad8(b)
    offsets = {c: starts_of(heads[:, head_words + i].astype(np.int64)) for i, c in enumerate(schema.counters)}
    pos = starts + 8 * width
    runs: dict[str, Runs] = {}
    for f in schema.ragged:
        nbytes = np.diff(offsets[f.counter]) * f.item_bytes
        runs[f.name] = Runs(sources, src, pos, nbytes)  # bytes: one run per record (checked below)
        pos = pos + pad8(nbytes)
    if n and np.any(pos > starts + np.maximum(lengths, 8 * width)):  # every run lies inside its record
        raise ValueError("records whose counts claim more bytes than the records hold")
    return EventChunk(first=first, n=n, columns=columns, offsets=offsets), runs


ZEROS = [bytes(k) for k in range(8)]  # a record's padding to 8 bytes, by its size


def head_rows(chunk: EventChunk, schema: EventSchema) -> np.ndarray:
    """Each record's head: its fixed fields (each padded to 8 bytes), then one int64 count per
    ragged group, as ``(n, bytes)`` uint8 rows."""
    head = [_fixed_block(chunk, schema)]
    head += [chunk.counts(c).astype(np.uint64)[:, None] for c in schema.counters]
    return np.ascontiguousarray(np.concatenate(head, axis=1)).view(np.uint8)


def row_slices(block: np.ndarray, order: np.ndarray) -> list[Any]:
    """The rows ``order`` of a 2-d array, one buffer each."""
    if block.shape[1] == 0 or len(order) == 0:
        return [b""] * len(order)
    width = block.shape[1]
    at = np.arange(len(order), dtype=np.int64) * width
    return slices(memoryview(np.ascontiguousarray(block[order])).cast("B"), at, at + width)


def _bytes_of(values: np.ndarray, f: Field) -> memoryview:
    if values.size == 0:
        return memoryview(b"")
    return memoryview(np.ascontiguousarray(values, dtype=f.np_dtype)).cast("B")


def _fixed_block(chunk: EventChunk, schema: EventSchema) -> np.ndarray:
    """The fixed fields of every event side by side, each padded to 8 bytes: ``(n, words)`` uint64."""
    width = sum(pad8(f.item_bytes) for f in schema.fixed)
    block = np.zeros((chunk.n, width), dtype=np.uint8)
    at = 0
    for f in schema.fixed:
        b = f.item_bytes
        col = np.ascontiguousarray(chunk.columns[f.name], dtype=f.np_dtype)
        block[:, at:at + b] = col.reshape(-1).view(np.uint8).reshape(chunk.n, b)
        at += pad8(b)
    return block.view(np.uint64)
