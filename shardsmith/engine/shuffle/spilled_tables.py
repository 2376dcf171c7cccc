"""The plan unit's split tables, sorted a slice of buckets at a time, so that its memory follows
``--memory``, not the corpus.

Why (issue 43): a split's table holds a row per segment, a (part file, bucket) run of samples. At
10 TB on 1,000 ranks that is ~10^9 rows: 28 GB as columns, and about twice that while they are
sorted by bucket, in the one unit that reads every footer (74 GB, by the simulation). Here every
part's footer is read once, in the tasks' order (as ``segments.split_segments`` reads them), and
its rows are routed to their slice of consecutive buckets: kept in memory when the whole table is
one slice under the budget, else appended to a file per (split, slice) in the unit's own folder
of the scratch folder. Then, a slice at a time, a slice's rows are sorted by bucket (stably: part
order, then the footer's own) and put in place in the split's plan file
(``split_plans.PlanFile``), and only each bucket's first row, bytes and samples are kept
(``BucketRuns``: O(buckets)). The rows come out in ``split_segments``' order: the plan is the one
a table held whole gives. Past one slice the routing costs the scratch folder each row written
and read once more (36 B).

Planning then reads the rows of the groups that hold a shard boundary from the plan file
(``SpilledSplit.group``). The folder is the plan unit's: a killed plan unit's is removed by the
next one (``spill_tables``), a finished one's by its caller.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.engine.output.outlock import pid_alive
from shardsmith.engine.shuffle.partfile import FOOTERS, Footers
from shardsmith.engine.shuffle.segments import BucketRuns, Segments, part_indexes
from shardsmith.engine.shuffle.split_gather import SplitGroups

ROW = np.dtype([("part", "<i4"), ("bucket", "<i8"), ("offset", "<i8"), ("count", "<i8"), ("payload", "<i8")])
_WORKING = 3  # a slice is held about three times while it is sorted (its rows, the order, a sorted column)


def planning_folder(work: Path, fp: str) -> Path:
    """This process's folder for the plan unit's transient files (routed rows, plan files before
    they are finished), in the scratch folder under the run's fingerprint, this host and process:
    two plan units at once (a user's mistake) each finish their own identical plan. The folders a
    killed plan unit of this host left are removed; another host's, with the scratch folder."""
    host = os.uname().nodename
    for old in Path(work).glob(f"planning-{fp}-{host}-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(work) / f"planning-{fp}-{host}-{os.getpid()}"


def slice_budget(memory: int) -> int:
    """The bytes a plan unit sorts at once under ``--memory``: a quarter of it (at least 16 MB)."""
    return max(16 << 20, memory // 4)


def slices_for(rows: int, budget: int, span: int) -> int:
    """How many slices of buckets keep a slice's sorting under ``budget`` bytes (a power of two,
    at most one a bucket of the ``span``)."""
    want = max(1, -(-_WORKING * ROW.itemsize * rows // max(1, budget)))
    return max(1, min(1 << (want - 1).bit_length(), span))


class SpilledSplit:
    """One split's table, routed into slices of buckets (``spill_tables``); sorted into its plan
    file a slice at a time (``sort_into``), after which planning reads the rows of a group from there."""

    def __init__(self, *, name: str, index: int, sink: _Sink, rows: int, paths: Sequence[str]) -> None:
        self.name, self.index, self.rows, self.paths = name, index, rows, paths
        self._sink = sink
        self.runs = BucketRuns.of_nothing()
        self.groups: SplitGroups | None = None
        self._out: Any = None

    def sort_into(self, out: Any) -> None:
        """Each slice's rows sorted by bucket (stably) and put in ``out`` (``split_plans.PlanFile``)
        in order; the buckets kept (``runs``). A slice's rows are let go once they are put."""
        runs, at = [], 0
        for rows in self._sink.slices(self.index):
            rows = rows[np.argsort(rows["bucket"], kind="stable")]
            runs.append(BucketRuns.of_rows(bucket=rows["bucket"], count=rows["count"], payload=rows["payload"]))
            out.put(at, rows)  # (its columns by name)
            at += len(rows)
            del rows
        assert at == self.rows, (at, self.rows)
        self.runs = BucketRuns.joined(runs) if runs else BucketRuns.of_nothing()
        self._out = out

    def segments(self, r0: int, r1: int) -> Segments:
        """Rows ``[r0, r1)`` of the sorted table."""
        assert self._out is not None, "read before sort_into"
        return self._out.rows(r0, r1)

    # what planning reads (``shard_plan.Plannable``), once ``groups`` is set
    @property
    def starts(self) -> np.ndarray:
        assert self.groups is not None
        return self.groups.starts

    @property
    def drop_bytes(self) -> list[int]:
        assert self.groups is not None
        return self.groups.drop_bytes

    @property
    def samples(self) -> int:
        return int(self.starts[-1])

    def drop(self, g: int) -> np.ndarray | None:
        assert self.groups is not None
        return self.groups.drops[g] if self.groups.drops else None

    def group(self, g: int) -> Segments:
        assert self.groups is not None
        return self.segments(int(self.groups.bounds[g]), int(self.groups.bounds[g + 1]))

    def group_payload(self, g: int) -> int:
        assert self.groups is not None
        return int(self.groups.payload[g])


class _Sink:
    """Where routed rows wait for their slice to be sorted: in memory when the whole table is one
    slice (nothing written but the plan file, as when the table was held whole), else a file per
    (split, slice) in ``folder``."""

    def __init__(self, *, folder: Path, slices: int) -> None:
        self.folder, self.n_slices = folder, slices
        self._held: dict[int, list[np.ndarray]] = {}
        self._files: dict[tuple[int, int], Any] = {}

    def add(self, split: int, piece: int, rows: np.ndarray) -> None:
        if self.n_slices == 1:
            self._held.setdefault(split, []).append(rows)  # (a view of its part's rows: held whole anyway)
            return
        fh = self._files.get((split, piece))
        if fh is None:
            fh = self._files[(split, piece)] = open(self.folder / f"rows-{split}-{piece}", "wb")  # noqa: SIM115
        fh.write(rows.tobytes())

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()

    def slices(self, split: int) -> Iterator[np.ndarray]:
        """Split ``split``'s slices in key order, each taken away once handed out."""
        if self.n_slices == 1:
            held = self._held.pop(split, [])
            if held:
                yield np.concatenate(held)
            return
        for piece in range(self.n_slices):
            if (split, piece) in self._files:
                path = self.folder / f"rows-{split}-{piece}"
                rows = np.fromfile(path, dtype=ROW)
                path.unlink()
                yield rows


def spill_tables(paths: Sequence[str], splits: Sequence[str], *, folder: Path, budget: int, span: int,
                 footers: Footers = FOOTERS) -> list[SpilledSplit]:
    """Every split's table from the footers of the part files ``paths`` (in the tasks' order), its
    rows routed to slices of buckets (files in ``folder``, made afresh, when they are more than one)
    so that a slice's sorting takes about ``budget`` bytes at most; ``span``: the buckets' ids are
    below it (larger ones join the last slice). Each split is then sorted into its plan file
    (``SpilledSplit.sort_into``)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    names = list(map(str, paths))
    n_splits = len(splits)
    rows_of = [0] * n_splits
    sink: _Sink | None = None
    shift = 0
    try:
        for p, index in part_indexes(names, n_splits, footers=footers):
            if sink is None:  # the parts are about equal: the first tells the table's size
                slices = slices_for(len(index) * len(names), budget, span)
                shift = max(0, (span - 1).bit_length() - (slices - 1).bit_length())
                sink = _Sink(folder=folder, slices=slices)
            rows = np.empty(len(index), dtype=ROW)
            rows["part"] = p
            for field in ("bucket", "offset", "count", "payload"):
                rows[field] = index[field]
            piece = np.minimum(index["bucket"].astype(np.int64) >> shift, sink.n_slices - 1)
            at = piece + index["split"].astype(np.int64) * sink.n_slices  # (sorted, as the index is by split, bucket)
            cuts = np.flatnonzero(np.diff(at)) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(at)]):
                split, k = divmod(int(at[a]), sink.n_slices)
                sink.add(split, k, rows[a:b])
                rows_of[split] += b - a
            footers.forget()  # (a footer read here is never read again in this process)
    finally:
        if sink is not None:
            sink.close()
    sink = sink or _Sink(folder=folder, slices=1)
    return [SpilledSplit(name=name, index=s, sink=sink, rows=rows_of[s], paths=names) for s, name in enumerate(splits)]
