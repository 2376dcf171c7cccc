"""The events table of the long layout: the per-event columns of one task's key range, read once
and looked up by key."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shardsmith.errors import DataError
from shardsmith.sources.parquet_events.arrays import _columns, _key_values
from shardsmith.sources.parquet_events.fields import _Leaf


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
