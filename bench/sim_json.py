"""The exchange before issue 43's binary footers (commit 8ac82ac), as a column beside today's: a
frozen copy of its footer handling, so that the table still shows what the binary, indexed footers
read once (``engine/shuffle/partfile.py``) and the columnar tables (``engine/shuffle/segments.py``) changed.

    python bench/sim_exchange.py --exchange json,today --sizes 1GB/2,10GB/10 --targets 1TB/100

What differs from today's exchange (``sim_today.Today``), and only this:

- the scatter writes each part with a JSON footer, ``{"meta": ..., "segments": [[split, bucket,
  offset, count, payload bytes], ...]}`` and a trailer of its length and ``SSPART01``;
- a gather unit and finalize parse every part's whole footer in ``run._scattered`` (for its meta:
  ``finished_task``), then every footer whole again in ``run.split_tables``, which makes a Python
  ``Segment`` per segment in lists per bucket and per group and holds them for the unit's life, as
  ``SplitGather.groups`` did; the plan unit parses each JSON footer whole once (``JsonIndex``) and
  builds its tables as today's does.

The rest of the unit is the engine's own code: ``split_tables`` hands it the engine's tables made
from the same segments (so a unit here holds ~30 B a segment more than the old code did, next to its
~300), and the groups are read, sorted and written as today.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import orjson
from sim_meter import Row
from sim_today import TaskRuns, Today

from shardsmith.engine.shuffle import run
from shardsmith.engine.shuffle.doc_facts import has_facts
from shardsmith.engine.shuffle.partfile import INDEX
from shardsmith.engine.shuffle.scatter import TaskResult, _task_id, part_path
from shardsmith.engine.shuffle.segments import Segments, SplitSegments
from shardsmith.engine.shuffle.spilled_tables import spill_tables
from shardsmith.engine.shuffle.split_gather import SplitGather
from shardsmith.errors import DatasetError
from shardsmith.kit.reader import Task

OLD_MAGIC = b"SSPART01"
OLD_TRAILER = struct.Struct("<Q8s")
HELD: list[Any] = []  # the old tables, alive for the unit's life (each unit is a process of its own)


@dataclass(slots=True)
class Segment:
    """Where one (split, bucket) run of samples lies in a part file (``kit/batches.Segment`` then)."""

    path: str
    offset: int
    count: int
    payload_bytes: int

    @property
    def nbytes(self) -> int:
        return self.payload_bytes + 24 * self.count


def json_footer(runs: TaskRuns, meta: dict[str, Any]) -> bytes:
    """The part's JSON footer and trailer (``shuffle.PartWriter.write`` then)."""
    segments = np.column_stack([runs.split, runs.bucket, runs.offsets, runs.counts, runs.payloads]).tolist()
    footer = orjson.dumps({"meta": meta, "segments": segments})
    return footer + OLD_TRAILER.pack(len(footer), OLD_MAGIC)


def read_part_footer(path: Path) -> dict:
    """The footer of a finished part file (``shuffle.read_part_footer`` then)."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if size < OLD_TRAILER.size:
            raise DatasetError(f"{path}: truncated part file")
        fh.seek(size - OLD_TRAILER.size)
        length, magic = OLD_TRAILER.unpack(fh.read(OLD_TRAILER.size))
        if magic != OLD_MAGIC or length > size - OLD_TRAILER.size:
            raise DatasetError(f"{path}: not a shardsmith part file")
        fh.seek(size - OLD_TRAILER.size - length)
        return orjson.loads(fh.read(length))


def finished_task(work_dir: str, task: Task, *, facts: Any = (), buckets: int | None = None, index: bool = True
                  ) -> TaskResult | None:
    """``scatter.finished_task`` then: the whole footer parsed for its meta."""
    path = part_path(work_dir, task.index)
    if not path.is_file() or not has_facts(work_dir, task.index, facts):
        return None
    try:
        meta = read_part_footer(path)["meta"]
    except Exception:  # noqa: BLE001 (a torn or foreign file: redo the task)
        return None
    if meta.get("task") != task.index or meta.get("plan") != _task_id(task) or "records" not in meta:
        return None
    if buckets is not None and meta.get("buckets") != buckets:
        return None
    return TaskResult(task=task.index, records=int(meta["records"]), skipped=list(meta.get("skipped", [])),
                      dropped=int(meta.get("dropped", 0)), removed=list(meta.get("removed", [])),
                      rules=dict(meta.get("rules", {})), stats=dict(meta.get("stats", {})), reused=True)


def _group(buckets: dict[int, list[Segment]], budget: int) -> Iterator[tuple[list[int], list[Segment]]]:
    """``shuffle._group`` then: consecutive buckets merged until a group reaches the budget."""
    group: list[Segment] = []
    ids: list[int] = []
    size = 0
    for bucket in sorted(buckets):
        segs = buckets[bucket]
        seg_bytes = sum(s.nbytes for s in segs)
        if group and size + seg_bytes > budget:
            yield ids, group
            group, ids, size = [], [], 0
        group.extend(segs)
        ids.append(bucket)
        size += seg_bytes
    if group:
        yield ids, group


def split_tables(job: Any, results: list[TaskResult], *, budget: int, duplicates: Any = None, origins: Any = None
                 ) -> list[SplitGather]:
    """``run.split_tables`` then: every footer parsed again, a ``Segment`` per segment, grouped, held;
    then the engine's own tables of the same segments, for the rest of the unit."""
    paths = [str(part_path(job.work_dir, r.task)) for r in results]
    parts = [(path, read_part_footer(Path(path))) for path in paths]
    table: list[dict[int, list[Segment]]] = [{} for _ in job.splits]
    for path, footer in parts:
        for split, bucket, offset, count, payload_bytes in footer["segments"]:
            table[split].setdefault(bucket, []).append(Segment(path, offset, count, payload_bytes))
    del parts
    number = {path: p for p, path in enumerate(paths)}
    out = []
    for s, (name, _) in enumerate(job.splits):
        HELD.append([group for _, group in _group(table[s], budget)])  # SplitGather.groups then
        segs = [seg for bucket in sorted(table[s]) for seg in table[s][bucket]]
        bucket = np.fromiter((b for b in sorted(table[s]) for _ in table[s][b]), dtype=np.int64, count=len(segs))
        columns = Segments(paths=paths, part=np.fromiter((number[g.path] for g in segs), np.int32, len(segs)),
                           offset=np.fromiter((g.offset for g in segs), np.int64, len(segs)),
                           count=np.fromiter((g.count for g in segs), np.int64, len(segs)),
                           payload=np.fromiter((g.payload_bytes for g in segs), np.int64, len(segs)))
        out.append(SplitGather.of(name, SplitSegments(segments=columns, bucket=bucket), budget=budget, origins=origins,
                                  removals=None if duplicates is None else duplicates.removals(s)))
    return out


class JsonIndex:
    """The plan unit's footers (``partfile.Footers``' ``rows``) from the JSON footers: each parsed
    whole, its segments as the binary index's rows (sorted by split, bucket, offset)."""

    def rows(self, path: str) -> np.ndarray:
        segments = np.asarray(read_part_footer(Path(path))["segments"], dtype=np.uint64).reshape(-1, 5)
        rows = np.zeros(len(segments), dtype=INDEX)
        for i, name in enumerate(INDEX.names):
            rows[name] = segments[:, i]
        return rows[np.lexsort((rows["offset"], rows["bucket"], rows["split"]))]

    def forget(self) -> None:
        pass


class JsonFooters(Today):
    """Today's exchange with the JSON footers and the ``Segment`` tables it had before issue 43's
    binary footers (8ac82ac): every footer parsed whole twice a unit, ~300 B held a segment."""

    name: ClassVar[str] = "json"
    footer = staticmethod(json_footer)
    rows: ClassVar[tuple[Row, ...]] = tuple(
        Row(r.label, r.kind, phase=r.phase, rank=r.rank,
            note=r.note if r.label != "scatter" else "simulated: JSON footers (8ac82ac), payloads as holes")
        for r in Today.rows)

    @staticmethod
    def footer_bytes(path: Path) -> int:
        with open(path, "rb") as fh:
            fh.seek(-OLD_TRAILER.size, os.SEEK_END)
            return OLD_TRAILER.unpack(fh.read(OLD_TRAILER.size))[0]

    def engine_as_is(self) -> None:
        run.finished_task = finished_task  # type: ignore[assignment]
        run.split_tables = split_tables  # type: ignore[assignment]
        run.spill_tables = functools.partial(spill_tables, footers=JsonIndex())  # type: ignore[assignment]
