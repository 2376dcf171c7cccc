"""Event records (``core/events.py`` layout) into columns, for a schema of one counter: what
``core.events.decode`` returns, by one numpy gather per field.

``decode`` cuts every record's ragged values out as a slice (a Python object per record and
field: 1.2 s per 100,000 events of 5 fields here, most of the memmap gather). With one counter,
each field's values sit at a position the counts alone give, so one index array per field
gathers them all (0.2 s); padding then reads these columns.
"""

from __future__ import annotations

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema
from shardsmith.core.ragged import starts_of


def _pad8(n: np.ndarray | int) -> np.ndarray | int:
    return (n + 7) // 8 * 8


def columns(lengths: np.ndarray, payload: np.ndarray | memoryview | bytes, schema: EventSchema, *,
            starts: np.ndarray | None = None) -> EventChunk:
    """The records (back to back, or at ``starts``) as columns; the schema has exactly one counter."""
    (counter,) = schema.counters
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    raw = np.frombuffer(payload, dtype=np.uint8)
    if raw.ctypes.data % 8:
        raw = raw.copy()
    if starts is None:
        ends = starts_of(lengths)
        if int(ends[-1]) != len(raw):
            raise ValueError(f"payload holds {len(raw)} bytes, lengths say {int(ends[-1])}")
        starts = ends[:-1]
    starts = np.asarray(starts, dtype=np.int64)
    if n and (int((starts + lengths).max()) > len(raw) or int(starts.min()) < 0 or np.any(starts % 8)):
        raise ValueError(f"record positions outside the payload's {len(raw)} bytes or not 8-byte aligned")
    words = raw[: len(raw) // 8 * 8].view("<i8")
    out: dict[str, np.ndarray] = {}
    at = 0
    for f in schema.fixed:
        b = f.item_bytes
        cells = raw[(starts + at)[:, None] + np.arange(b)] if b else np.zeros((n, 0), np.uint8)
        out[f.name] = cells.view(f.np_dtype).reshape(n, *f.shape)
        at += _pad8(b)
    counts = words[(starts + at) // 8].astype(np.int64)
    offsets = starts_of(counts)
    pos = starts + at + 8  # where each record's first ragged field begins
    within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
    for f in schema.ragged:
        size = f.np_dtype.itemsize
        view = raw[: len(raw) // size * size].view(f.np_dtype)
        out[f.name] = view[np.repeat(pos // size, counts) + within]  # 8-aligned: a whole number of items
        pos = pos + _pad8(counts * size)
    return EventChunk(first=0, n=n, columns=out, offsets={counter: offsets})
