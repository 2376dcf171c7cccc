"""Event records (``core/events.py`` layout) into columns, for a schema of one counter: what
``core.events.decode`` returns, by one numpy gather per field.

``decode`` cuts every record's ragged values out as a slice (a Python object per record and
field: 1.2 s per 100,000 events of 5 fields here, most of the memmap gather). With one counter,
each field's values sit at a position the counts alone give, so one index array per field
gathers them all (0.2 s); padding then reads these columns.
"""

from __future__ import annotations

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema, pad8, record_starts
from shardsmith.core.ragged import starts_of


def columns(lengths: np.ndarray, payload: np.ndarray | memoryview | bytes, schema: EventSchema, *,
            starts: np.ndarray | None = None) -> EventChunk:
    """The records (back to back, or at ``starts``) as columns; the schema has exactly one counter."""
    (counter,) = schema.counters
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    back_to_back = starts is None
    raw, starts = record_starts(lengths, payload, starts)
    if back_to_back and n and np.any(starts % 8):  # then each record must be padded to 8 bytes
        raise ValueError(f"record positions outside the payload's {len(raw)} bytes or not 8-byte aligned")
    words = raw[: len(raw) // 8 * 8].view("<i8")
    out: dict[str, np.ndarray] = {}
    at = 0
    for f in schema.fixed:
        b = f.item_bytes
        cells = raw[(starts + at)[:, None] + np.arange(b)] if b else np.zeros((n, 0), np.uint8)
        out[f.name] = cells.view(f.np_dtype).reshape(n, *f.shape)
        at += pad8(b)
    counts = words[(starts + at) // 8].astype(np.int64)
    offsets = starts_of(counts)
    pos = starts + at + 8  # where each record's first ragged field begins
    within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
    for f in schema.ragged:
        size = f.np_dtype.itemsize
        view = raw[: len(raw) // size * size].view(f.np_dtype)
        out[f.name] = view[np.repeat(pos // size, counts) + within]  # 8-aligned: a whole number of items
        pos = pos + pad8(counts * size)
    return EventChunk(first=0, n=n, columns=out, offsets={counter: offsets})
