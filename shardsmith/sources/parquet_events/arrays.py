"""Arrow arrays to numpy: a leaf's values and offsets (zero copy where Arrow allows), nulls in
numeric columns and keys as ``DataError``s naming the row, and the check that a file is grouped by its key."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.core.input_file import InputFile
from shardsmith.errors import DataError
from shardsmith.sources.parquet_events.fields import _LIST, _Leaf


class _Null(Exception):
    """A null where a number must be, at this row of the batch."""

    def __init__(self, row: int) -> None:
        self.row = row


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
