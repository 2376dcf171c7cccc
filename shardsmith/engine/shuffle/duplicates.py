"""Which documents a dedup rule removes (``--dedup``), decided once between the scatter and the
gather from the facts every scatter task recorded (``engine/shuffle/doc_facts.py``).

Of each set of duplicates the first in input order stays (input files in sorted order, then line
or row); the others are left out of the gather, which never reads them again. The decision is a
pure function of the facts, so every gather rank and the finalize that compute it get the same
rows; it is saved once in the scratch folder (``duplicates.npy``) under a temporary name renamed
into place. Exact dedup sorts the documents' 128-bit hashes in as many partitions (by hash) as
``--memory`` needs; MinHash clusters band keys (``text/minhash.py``), spilling like the shuffle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.engine.shuffle.doc_facts import BASE, atomic_write_npy, column
from shardsmith.kit.keys import ORDER_RECORD_BITS
from shardsmith.kit.reader import located
from shardsmith.text.cleaning import CleaningSpec

DROP = np.dtype([("order", "<u8"), ("group", "<i8"), ("length", "<i8"), ("nbytes", "<i8"), ("kept", "<u8")])
_ROW_BYTES = 48  # what a document costs while its partition is sorted (hash, order, group, lengths, index)


@dataclass(frozen=True)
class Duplicates:
    """The documents a dedup rule removed, sorted by input order, each with the one it duplicates."""

    rule: str
    rows: np.ndarray  # DROP

    def removals(self, split: int) -> BucketRemovals:
        """What the gather of split ``split`` leaves out."""
        mine = self.rows[(self.rows["group"] >> 32) == split]
        return BucketRemovals(rows=mine)

    def summary(self, units: str) -> dict[str, int]:
        return {"documents": len(self.rows), units: int(self.rows["length"].sum())}

    def entries(self, files: dict[int, tuple[str, str]]) -> list[dict[str, Any]]:
        """The rows as ``--removed`` lists them: the document and the one kept in its place;
        ``files``: file index -> (relative path, record unit)."""
        out = []
        for order, kept in zip(self.rows["order"].tolist(), self.rows["kept"].tolist()):
            out.append({**_where(order, files), "rule": self.rule, "duplicate_of": _where(kept, files)})
        return out


def _where(order: int, files: dict[int, tuple[str, str]]) -> dict[str, Any]:
    index, record = order >> ORDER_RECORD_BITS, order & ((1 << ORDER_RECORD_BITS) - 1)
    rel, unit = files[index]
    return located(rel, record, unit)


class BucketRemovals:
    """One split's removed documents by bucket, as ``gather.SplitGather`` asks for them: sorted by
    (bucket, input order) once, so a group of consecutive buckets is one slice."""

    def __init__(self, *, rows: np.ndarray) -> None:
        bucket = rows["group"] & 0xFFFFFFFF
        perm = np.lexsort((rows["order"], bucket))
        self.rows, self.bucket = rows[perm], bucket[perm]

    def _in(self, buckets: list[int]) -> np.ndarray:
        lo = int(np.searchsorted(self.bucket, min(buckets), side="left"))
        hi = int(np.searchsorted(self.bucket, max(buckets), side="right"))
        rows = self.rows[lo:hi]
        if len(rows) and len(buckets) != max(buckets) - min(buckets) + 1:  # not consecutive: pick them out
            rows = rows[np.isin(self.bucket[lo:hi], np.asarray(buckets, dtype=np.int64))]
        return rows

    def orders(self, buckets: list[int]) -> np.ndarray | None:
        rows = self._in(buckets)
        return np.sort(rows["order"]) if len(rows) else None

    def nbytes(self, buckets: list[int]) -> int:
        return int(self._in(buckets)["nbytes"].sum())


def find_duplicates(spec: CleaningSpec, *, work_dir: str | Path, tasks: Sequence[int], memory: int) -> Duplicates:
    """The documents ``spec.dedup`` removes (the saved decision when an earlier process made it)."""
    assert spec.dedup is not None
    path = Path(work_dir) / "duplicates.npy"
    try:
        rows = np.load(path, allow_pickle=False)
        if rows.dtype == DROP:
            return Duplicates(rule=spec.dedup, rows=rows)
    except (OSError, ValueError):
        pass  # absent or torn: decide it
    rows = _exact(work_dir, tasks, memory) if spec.exact else _near(spec, work_dir, tasks, memory)
    rows = rows[np.argsort(rows["order"], kind="stable")]
    atomic_write_npy(path, rows)
    return Duplicates(rule=spec.dedup, rows=rows)


def _exact(work_dir: str | Path, tasks: Sequence[int], memory: int) -> np.ndarray:
    """Documents whose hash an earlier document has, in hash partitions that fit ``memory``."""
    n = sum(len(b) for b in column(work_dir, tasks, "base"))
    parts = max(1, math.ceil(n * _ROW_BYTES / max(memory // 4, 1)))
    found: list[np.ndarray] = []
    for p in range(parts):
        bases, hashes = [], []
        for base, h in zip(column(work_dir, tasks, "base"), column(work_dir, tasks, "hash")):
            sel = np.flatnonzero(h[:, 0] % np.uint64(parts) == np.uint64(p)) if parts > 1 else slice(None)
            bases.append(np.asarray(base[sel]))
            hashes.append(np.asarray(h[sel]))
        base = np.concatenate(bases) if bases else np.zeros(0, BASE)
        h = np.concatenate(hashes) if hashes else np.zeros((0, 2), np.uint64)
        found.append(_repeats(base, h))
    return np.concatenate(found) if found else np.zeros(0, DROP)


def _repeats(base: np.ndarray, h: np.ndarray) -> np.ndarray:
    """The rows whose hash an earlier row (by input order) has, each with that first row's order."""
    if not len(base):
        return np.zeros(0, DROP)
    perm = np.lexsort((base["order"], h[:, 1], h[:, 0]))
    h, base = h[perm], base[perm]
    first = np.ones(len(base), bool)
    first[1:] = (h[1:, 0] != h[:-1, 0]) | (h[1:, 1] != h[:-1, 1])
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(base)), 0))
    return _drop_rows(base, base["order"][run_start], ~first)


def _drop_rows(base: np.ndarray, kept: np.ndarray, gone: np.ndarray) -> np.ndarray:
    rows = np.empty(int(gone.sum()), DROP)
    for name in ("order", "group", "length", "nbytes"):
        rows[name] = base[name][gone]
    rows["kept"] = kept[gone]
    return rows


def _near(spec: CleaningSpec, work_dir: str | Path, tasks: Sequence[int], memory: int) -> np.ndarray:
    """Documents in a MinHash cluster whose first member (in input order) is another document."""
    base = np.concatenate([np.asarray(b) for b in column(work_dir, tasks, "base")] or [np.zeros(0, BASE)])
    # the first of a cluster is its smallest index: the facts in task order must be the input in order
    assert len(base) < 2 or bool(np.all(base["order"][1:] > base["order"][:-1])), "facts out of input order"
    tmp = Path(work_dir) / "minhash"
    tmp.mkdir(parents=True, exist_ok=True)
    first = spec.near_duplicates(lambda: column(work_dir, tasks, "bands"), len(base), memory=memory, tmp_dir=tmp)
    gone = first != np.arange(len(base))
    return _drop_rows(base, base["order"][first], gone)
