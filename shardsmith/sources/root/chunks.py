"""uproot's awkward arrays to ``EventChunk``s: columns and shared offsets read as views of the
layouts' buffers, and chunks cut into steps of bounded size."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from shardsmith.core.events import EventChunk, Field
from shardsmith.errors import DataError
from shardsmith.sources.root.schema import _Leaf


def _to_chunk(arrays: dict[str, Any], leaves: list[_Leaf], *, first: int, file: str) -> EventChunk:
    """Columns and shared offsets from uproot's awkward arrays, through the layouts' buffers."""
    import awkward as ak

    columns: dict[str, np.ndarray] = {}
    offsets: dict[str, np.ndarray] = {}
    owner: dict[str, str] = {}
    n = -1
    for leaf in leaves:
        f = leaf.field
        layout = ak.to_layout(arrays[leaf.path[0]])
        n = len(layout) if n < 0 else n
        try:
            values, off = _extract(layout, leaf.path[1:])
        except _Repack:  # ListArray with gaps, IndexedArray: one packed copy, then the same walk
            values, off = _extract(ak.to_layout(ak.to_packed(arrays[leaf.path[0]])), leaf.path[1:])
        if f.counter is None:
            columns[f.name] = _as(values, f)
            continue
        assert off is not None
        if f.counter in offsets:
            if not np.array_equal(offsets[f.counter], off):
                bad = int(np.flatnonzero(offsets[f.counter] != off)[0]) - 1
                raise DataError(file=file, record=first + max(bad, 0), unit="entry",
                                reason=f"{leaf.key!r} and {owner[f.counter]!r} share the counter {f.counter!r} "
                                       f"but their lengths differ")
        else:
            offsets[f.counter] = off
            owner[f.counter] = leaf.key
        columns[f.name] = _as(values, f)
    return EventChunk(first=first, n=max(n, 0), columns=columns, offsets=offsets)


class _Repack(Exception):
    """A layout that is not plain buffers (indexed, or lists out of order): pack it first."""


def _extract(layout: Any, fields: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    """The leaf's values (rows, *shape) and, if it is jagged, its offsets starting at 0.

    Views of uproot's buffers: offsets are sliced (and shifted to start at 0), the content is
    sliced to the rows they cover. Raises ``_Repack`` for layouts that need packing first.
    """
    import awkward as ak

    node = layout
    lo, hi = 0, len(layout)  # rows of ``node`` that belong to this chunk
    off: np.ndarray | None = None
    i = 0
    while True:
        if isinstance(node, ak.contents.UnmaskedArray):
            node = node.content
        elif isinstance(node, ak.contents.RecordArray):
            node = node.content(fields[i])
            i += 1
        elif isinstance(node, ak.contents.ListOffsetArray):
            raw = np.asarray(node.offsets)[lo:hi + 1].astype(np.int64, copy=False)
            lo, hi = int(raw[0]), int(raw[-1])
            off = raw - lo if lo else raw
            node = node.content
        elif isinstance(node, ak.contents.ListArray):
            starts = np.asarray(node.starts)[lo:hi].astype(np.int64, copy=False)
            stops = np.asarray(node.stops)[lo:hi].astype(np.int64, copy=False)
            if len(starts) and not np.array_equal(starts[1:], stops[:-1]):
                raise _Repack  # lists out of order or with gaps
            lo, hi = (int(starts[0]), int(stops[-1])) if len(starts) else (0, 0)
            off = np.concatenate([[lo], stops]) - lo
            node = node.content
        elif isinstance(node, (ak.contents.RegularArray, ak.contents.NumpyArray)):
            return _rows(node, lo, hi), off
        else:
            raise _Repack


def _rows(node: Any, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of a NumpyArray, or of a RegularArray of them, as one numpy view."""
    import awkward as ak

    if isinstance(node, ak.contents.NumpyArray):
        return np.asarray(node.data)[lo:hi]
    size = node.size
    inner = _rows(node.content, lo * size, hi * size)
    return inner.reshape(hi - lo, size, *inner.shape[1:])


def _as(values: np.ndarray, f: Field) -> np.ndarray:
    """Little-endian values of the schema's dtype (ROOT stores big-endian)."""
    want = f.np_dtype
    return values if values.dtype == want else values.astype(want)


def _split(chunk: EventChunk, step: int, leaves: list[_Leaf]) -> Iterator[EventChunk]:
    """A chunk cut into pieces of at most ``step`` events (views, no copies)."""
    if chunk.n <= step:
        if chunk.n:
            yield chunk
        return
    for a in range(0, chunk.n, step):
        b = min(a + step, chunk.n)
        columns: dict[str, np.ndarray] = {}
        offsets: dict[str, np.ndarray] = {}
        for c, off in chunk.offsets.items():
            offsets[c] = off[a:b + 1] - off[a]
        for leaf in leaves:
            f = leaf.field
            col = chunk.columns[f.name]
            if f.counter is None:
                columns[f.name] = col[a:b]
            else:
                off = chunk.offsets[f.counter]
                columns[f.name] = col[off[a]:off[b]]
        yield EventChunk(first=chunk.first + a, n=b - a, columns=columns, offsets=offsets)
