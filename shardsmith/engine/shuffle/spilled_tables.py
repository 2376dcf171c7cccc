"""The plan unit's split tables, built in the scratch folder a slice of buckets at a time, so that
its memory follows ``--memory``, not the corpus.

Why (issue 43): a split's table holds a row per segment, a (part file, bucket) run of samples. At
10 TB on 1,000 ranks that is ~10^9 rows: 28 GB as columns, and about twice that while they are
sorted by bucket, in the one unit that reads every footer. Here every part's footer is read once,
in the tasks' order (as ``segments.split_segments`` reads them), and its rows go to one file per
(split, slice of consecutive buckets). Then, a slice at a time, a slice's rows are sorted by bucket
(stably: part order, then the footer's own) and appended to the split's column files, and only
each bucket's first row, bytes and samples are kept (``BucketRuns``: O(buckets)). The rows come
out in ``split_segments``' order, so the plan file is the one a table held whole would give.

Planning then reads the rows of the groups that hold a shard boundary (``SpilledSplit.group``),
and the plan file copies the column files (``columns``). The folder is the plan unit's own: a
killed plan unit's is removed by the next one (``spill_tables``), a finished one's by its caller.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from shardsmith.engine.shuffle.partfile import FOOTERS, Footers
from shardsmith.engine.shuffle.segments import BucketRuns, Segments
from shardsmith.engine.shuffle.split_gather import SplitGroups
from shardsmith.errors import DatasetError

ROW = np.dtype([("part", "<i4"), ("bucket", "<i8"), ("offset", "<i8"), ("count", "<i8"), ("payload", "<i8")])
COLUMNS = (("part", np.dtype("<i4")), ("offset", np.dtype("<i8")), ("count", np.dtype("<i8")),
           ("payload", np.dtype("<i8")))
_WORKING = 3  # a slice is held about three times while it is sorted (its rows, the order, a sorted column)
_COPY = 8 << 20  # bytes a column file is copied into the plan file at a time


def slice_budget(memory: int) -> int:
    """The bytes a plan unit sorts at once under ``--memory``: a quarter of it (at least 16 MB)."""
    return max(16 << 20, memory // 4)


def slices_for(rows: int, budget: int, span: int) -> int:
    """How many slices of buckets keep a slice's sorting under ``budget`` bytes (a power of two,
    at most one a bucket of the ``span``)."""
    want = max(1, -(-_WORKING * ROW.itemsize * rows // max(1, budget)))
    return max(1, min(1 << (want - 1).bit_length(), span))


class SpilledSplit:
    """One split's table in column files of the scratch folder, and its buckets; the rows of a
    group are read when planning asks for them."""

    def __init__(self, *, name: str, folder: Path, paths: Sequence[str], runs: BucketRuns) -> None:
        self.name, self.folder, self.paths, self.runs = name, folder, paths, runs
        self.groups: SplitGroups | None = None

    @property
    def rows(self) -> int:
        return int(self.runs.first[-1])

    def column_path(self, column: str) -> Path:
        return self.folder / f"{self.name}.{column}"

    def segments(self, r0: int, r1: int) -> Segments:
        """Rows ``[r0, r1)`` of the table, read from its column files."""
        cols = {}
        for column, dt in COLUMNS:
            with open(self.column_path(column), "rb") as fh:
                data = os.pread(fh.fileno(), dt.itemsize * (r1 - r0), dt.itemsize * r0)
            if len(data) != dt.itemsize * (r1 - r0):
                raise DatasetError(f"{self.column_path(column)}: cut short while the plan was made")
            cols[column] = np.frombuffer(data, dtype=dt).astype(dt.newbyteorder("="))
        return Segments(paths=self.paths, **cols)

    def columns(self) -> Iterator[bytes]:
        """The table's bytes as the plan file holds them: each column whole, in ``COLUMNS`` order."""
        for column, _ in COLUMNS:
            with open(self.column_path(column), "rb") as fh:
                while data := fh.read(_COPY):
                    yield data

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


def spill_tables(paths: Sequence[str], splits: Sequence[str], *, folder: Path, budget: int, span: int,
                 footers: Footers = FOOTERS) -> list[SpilledSplit]:
    """Every split's table from the footers of the part files ``paths`` (in the tasks' order), into
    ``folder`` (made afresh), sorting at most about ``budget`` bytes at once; ``span``: the buckets'
    ids are below it (larger ones join the last slice)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    names = list(map(str, paths))
    n_splits = len(splits)
    slices = 0
    shift = 0
    spills: dict[tuple[int, int], Path] = {}
    with contextlib.ExitStack() as files:
        handles: dict[tuple[int, int], object] = {}
        for p, path in enumerate(names):
            index = footers.rows(path)
            if len(index) and int(index["split"][-1]) >= n_splits:
                raise DatasetError(f"{path}: part file names split {int(index['split'][-1])} of a run with {n_splits}")
            if not slices:  # the parts are about equal: the first tells the table's size
                slices = slices_for(len(index) * len(names), budget, span)
                shift = max(0, (span - 1).bit_length() - (slices - 1).bit_length())
            rows = np.empty(len(index), dtype=ROW)
            rows["part"] = p
            for field in ("bucket", "offset", "count", "payload"):
                rows[field] = index[field]
            at = np.minimum(index["bucket"].astype(np.int64) >> shift, slices - 1) + index["split"].astype(np.int64) * slices
            cuts = np.flatnonzero(np.diff(at)) + 1  # (the index is sorted by split, then bucket: so is ``at``)
            for a, b in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(at)]]).tolist()):
                key = divmod(int(at[a]), slices)
                if key not in handles:
                    spills[key] = folder / f"rows-{key[0]}-{key[1]}"
                    handles[key] = files.enter_context(open(spills[key], "wb"))
                handles[key].write(rows[a:b].tobytes())  # type: ignore[attr-defined]
            footers.forget()  # (a footer read here is never read again in this process)
    out = []
    for s, name in enumerate(splits):
        runs = []
        split_folder = folder / f"split-{s}"
        split_folder.mkdir()
        table = SpilledSplit(name=name, folder=split_folder, paths=names, runs=BucketRuns.of_nothing())
        with contextlib.ExitStack() as files:
            cols = {c: files.enter_context(open(table.column_path(c), "wb")) for c, _ in COLUMNS}
            for k in range(slices):
                spill = spills.get((s, k))
                if spill is None:
                    continue
                rows = np.fromfile(spill, dtype=ROW)
                spill.unlink()
                order = np.argsort(rows["bucket"], kind="stable")
                rows = rows[order]
                del order
                runs.append(BucketRuns.of_rows(bucket=rows["bucket"], count=rows["count"], payload=rows["payload"]))
                for c, dt in COLUMNS:
                    cols[c].write(np.ascontiguousarray(rows[c], dtype=dt))
                del rows
        table.runs = BucketRuns.joined(runs) if runs else BucketRuns.of_nothing()
        out.append(table)
    return out
