"""Per-document facts a scatter task records beside its part file when the run cleans or traces
text (``text/cleaning.py``): one ``.npy`` file per task and column in the scratch folder.

``base`` (every cleaning run): each written document's input order, its (split, bucket) group and
its payload's length (in the payload's units, tokens for token ids) and bytes: all the engine needs
to leave a document out of the gather;
``hash`` or ``bands``: its dedup key; ``origin``: where it came from (``kit/doc_origin.py``).
Rows follow the order the scatter wrote them in, which for one task is input order; the tasks in
order are the whole input in order. The files are written before the part file is renamed into
place, so a finished part has its facts.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.kit.doc_origin import DOC_ORIGIN, text_hashes
from shardsmith.kit.keys import ORDER_RECORD_BITS
from shardsmith.kit.processed import Processed
from shardsmith.kit.reader import Reader, Task
from shardsmith.text.cleaning import Cleaner

BASE = np.dtype([("order", "<u8"), ("group", "<i8"), ("length", "<i8"), ("nbytes", "<i8")])


def atomic_write_npy(path: Path, array: np.ndarray) -> None:
    """A numpy array as a ``.npy`` file (no pickle), written whole and fsynced under its name."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())


def facts_path(work_dir: str | Path, task: int, column: str) -> Path:
    return Path(work_dir) / "facts" / f"{task:06d}.{column}.npy"


class TaskFacts:
    """One task's facts, gathered batch by batch in the worker and written at the task's end."""

    def __init__(self, *, cleaner: Cleaner, reader: Reader, task: Task) -> None:
        self.cleaner = cleaner
        self.reader = reader
        self.task = task
        self.chunks: dict[str, list[np.ndarray]] = {c: [] for c in cleaner.spec.columns()}

    def add(self, out: Processed, *, order: np.ndarray, group: np.ndarray) -> None:
        """The documents of a batch as the scatter placed them (``order``, ``group`` per record)."""
        assert out.texts is None or len(out.texts) == len(order), "a text per document"
        base = np.empty(len(order), dtype=BASE)
        base["order"], base["group"], base["length"], base["nbytes"] = order, group, out.lengths, out.byte_lengths()
        self.chunks["base"].append(base)
        texts = out.texts or []
        for name, values in self.cleaner.doc_columns(texts, out.normalized).items():
            self.chunks[name].append(values)
        if "origin" in self.chunks:
            self.chunks["origin"].append(self._origins(out, order))

    def _origins(self, out: Processed, order: np.ndarray) -> np.ndarray:
        rows = np.empty(len(order), dtype=DOC_ORIGIN)
        rows["file"] = (order >> np.uint64(ORDER_RECORD_BITS)).astype(np.uint32)
        rows["record"] = out.records
        offsets = self.reader.record_offsets(self.task, out.records)
        rows["offset"] = -1 if offsets is None else offsets
        rows["hash"] = text_hashes(out.raw_texts if out.raw_texts is not None else out.texts or [])
        return rows

    def write(self, work_dir: str) -> None:
        """Every column's file, each under a temporary name renamed when whole."""
        for name, chunks in self.chunks.items():
            path = facts_path(work_dir, self.task.index, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_npy(path, np.concatenate(chunks) if chunks else _empty(name, self.cleaner))


def _empty(name: str, cleaner: Cleaner) -> np.ndarray:
    if name == "base":
        return np.zeros(0, BASE)
    if name == "origin":
        return np.zeros(0, DOC_ORIGIN)
    return cleaner.doc_columns([]).get(name, np.zeros((0, 2), np.uint64))


def has_facts(work_dir: str, task: int, columns: Sequence[str]) -> bool:
    """Whether the task's facts are whole: each column's file there, its header and size agreeing."""
    for c in columns:
        try:
            np.load(facts_path(work_dir, task, c), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError):
            return False
    return True


def column(work_dir: str | Path, tasks: Sequence[int], name: str) -> Iterator[np.ndarray]:
    """A column, task by task in input order (memory-mapped: read as it is used)."""
    for t in tasks:
        yield np.load(facts_path(work_dir, t, name), mmap_mode="r", allow_pickle=False)


class OriginIndex:
    """Input order -> origin, for the gather (``--provenance``): every task's ``origin`` rows with
    their orders, in input order, joined once into two files of the scratch folder and
    memory-mapped by each gather process. Picklable (the maps open on first use)."""

    def __init__(self, *, work_dir: str | Path, tasks: Sequence[int]) -> None:
        self.work_dir = Path(work_dir)
        self.tasks = list(tasks)
        self._orders: Any = None
        self._rows: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"work_dir": self.work_dir, "tasks": self.tasks, "_orders": None, "_rows": None}

    def build(self) -> None:
        """Join the tasks' rows, sorted by input order (each rank and stage may: the same bytes,
        renamed into place). Tasks in order are the input in order, so the sort is a check."""
        paths = self.work_dir / "origin-orders.npy", self.work_dir / "origins.npy"
        if all(p.is_file() for p in paths):
            return
        orders = np.concatenate([np.asarray(a["order"]) for a in column(self.work_dir, self.tasks, "base")]
                                or [np.zeros(0, np.uint64)])
        rows = np.concatenate([np.asarray(a) for a in column(self.work_dir, self.tasks, "origin")]
                              or [np.zeros(0, DOC_ORIGIN)])
        if len(orders) > 1 and not np.all(orders[1:] > orders[:-1]):
            perm = np.argsort(orders, kind="stable")
            orders, rows = orders[perm], rows[perm]
        for path, values in zip(paths, (orders, rows)):
            atomic_write_npy(path, values)

    def __call__(self, orders: np.ndarray) -> np.ndarray:
        if self._orders is None:
            self._orders = np.load(self.work_dir / "origin-orders.npy", mmap_mode="r", allow_pickle=False)
            self._rows = np.load(self.work_dir / "origins.npy", mmap_mode="r", allow_pickle=False)
        at = np.searchsorted(self._orders, orders)
        if len(at) and (at.max() >= len(self._orders) or not np.array_equal(self._orders[at], orders)):
            raise AssertionError("a gathered document has no origin row")
        return np.asarray(self._rows[at])
