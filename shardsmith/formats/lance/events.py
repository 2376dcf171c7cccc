"""Physics events in a Lance dataset: each event one row, written by the Lance writer of rows
(``writer.py``: the same rollover, groups, data files and table), its groups typed from the events'
own columns instead of from row samples.

The workers hand the writer event records (``core/events.py``'s codec, the payload every format of
events reads); a group's records are decoded at once into columns (``decode``), and each field
becomes one Arrow column of its own dtype, with no loop per event: a scalar field a typed column
(``float32``, ``int32``, ``bool``), a fixed inner shape fixed-size lists, a jagged field (a counter's
member) a ``list<dtype>`` column cut by its counter's offsets. ``__key__`` is the event's place in
the split, ``e0000000000`` on (the shuffle moves columns, not names: as event tar shards name
their samples), so the same events give the same bytes for any ``--workers``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from shardsmith.core.events import EventChunk, EventSchema, Field, decode
from shardsmith.formats.arrow_rows.columns import packed
from shardsmith.formats.lance.writer import LanceShardWriter
from shardsmith.kit.sample import KEY
from shardsmith.kit.writer import ShardRange


class LanceEventWriter(LanceShardWriter):
    """``LanceShardWriter`` whose groups are events (``schema``), typed as the module says."""

    def __init__(self, *, out_dir: Path, split: str, schema: EventSchema, shard_samples: int | None,
                 shard_bytes: int | None, part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, shard_samples=shard_samples, shard_bytes=shard_bytes,
                         part=part)
        self.schema = schema
        self.events = self.part.first_sample  # the split-wide place of the next group's first event

    def _end_group(self) -> None:
        if self._rows:
            lengths = np.fromiter((len(r) for r in self._rows), dtype=np.int64, count=len(self._rows))
            chunk = decode(lengths, b"".join(self._rows), self.schema)
            self._groups.append(packed(event_table(chunk, self.schema, first=self.events)))
            self.events += chunk.n
            self._rows = []

    def abort(self) -> None:
        super().abort()
        self.events = self.part.first_sample


def event_table(chunk: EventChunk, schema: EventSchema, *, first: int) -> pa.Table:
    """A chunk's events as one table: ``__key__`` (their places from ``first``), then each field."""
    keys = pa.array([f"e{i:010d}" for i in range(first, first + chunk.n)], type=pa.string())
    columns = {KEY: keys}
    for f in schema.fields:
        columns[f.name] = _column(chunk, f)
    return pa.table(columns)


def _column(chunk: EventChunk, f: Field) -> pa.Array:
    values = np.ascontiguousarray(chunk.columns[f.name], dtype=f.np_dtype.newbyteorder("="))
    flat: pa.Array = pa.array(values.reshape(-1))
    for size in reversed(f.shape):  # a fixed inner shape: fixed-size lists, innermost first
        flat = pa.FixedSizeListArray.from_arrays(flat, int(size))
    if f.counter is None:
        return flat
    offsets = chunk.offsets[f.counter]
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat)

