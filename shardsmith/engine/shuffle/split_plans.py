"""The plan of a staged run, made once by the plan unit (``units.PlanUnit``) and read in parts by
the gather units and finalize, so that none of them parses every part file's footer (issue 43).

Per split, one binary file: its magic and row count; the split's segment table a column at a time
(part file, offset, count, payload bytes), written in place as the plan unit sorts it a slice at a
time (``spilled_tables.py``); then a JSON header (the split's name, its shard plan, its part files)
and arrays, each at an offset the header's sizes give: per bucket group its first row, its first
kept sample, where its removed input orders start, their payload bytes; the removed orders. A
gather unit reads the header and the per-group arrays (O(groups)), then of each column only the
rows of the groups its shard range lies in (``PlannedSplit.table``). Per run, every scatter task's
result (which finalize reads instead of the footers; a gather unit, never), and an index written
last (its presence means the whole plan is there): each split's size and shard count.

Every name holds the run's fingerprint (as ``plan.cached``'s records do): a plan another run left
is never read. Each file is written under a temporary name and renamed whole (``PlanFile``), so a
plan unit killed half-way leaves no index and is simply run again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from shardsmith.core.fsutil import atomic_write_bytes, fsync_dir
from shardsmith.engine.shuffle.doc_facts import OriginIndex
from shardsmith.engine.shuffle.scatter import TaskResult
from shardsmith.engine.shuffle.segments import Segments
from shardsmith.engine.shuffle.shard_plan import SplitPlan
from shardsmith.engine.shuffle.split_gather import SplitGather, SplitGroups
from shardsmith.errors import DatasetError, UsageError

MAGIC = b"SSPLAN02"
_GROUP = ("bounds", "starts", "drop_at")  # int64, groups + 1 each
_COLUMNS = (("part", np.dtype("<i4")), ("offset", np.dtype("<i8")), ("count", np.dtype("<i8")),
            ("payload", np.dtype("<i8")))
_I8, _U8 = np.dtype("<i8"), np.dtype("<u8")


def fingerprint(run: dict[str, str] | None) -> str:
    """The run's part of the plan files' names (options and inputs, as ``plan.cached`` names its records)."""
    return "local" if run is None else f"{run['options'][:12]}-{run['inputs'][:12]}"


def index_path(work: Path, fp: str) -> Path:
    return Path(work) / f"planned-{fp}.json"


def results_path(work: Path, fp: str) -> Path:
    return Path(work) / f"planned-{fp}-results.json"


def split_path(work: Path, fp: str, name: str) -> Path:
    return Path(work) / f"planned-{fp}-{name}.bin"


class PlanFile:
    """A split's plan file being written: the segment table's rows put in place as they are sorted
    (``put``) and read back by the planning (``rows``), then the groups, removals and shard plan
    appended and the file renamed into place (``finish``). Never seen under its name half-written."""

    def __init__(self, path: Path, *, rows: int, paths: Sequence[str], tmp_dir: Path) -> None:
        self.path, self.n_rows, self.paths = Path(path), rows, paths
        self._tmp = Path(tmp_dir) / f"{self.path.name}.tmp"  # (the plan unit's own folder: gone with it)
        self._fh = open(self._tmp, "w+b")  # noqa: SIM115 (closed in finish or abort)
        self._fh.write(MAGIC + rows.to_bytes(8, "little"))
        self._at = _columns_at(rows)

    def put(self, r0: int, columns: dict[str, np.ndarray]) -> None:
        """Rows from ``r0`` on, a column each (``_COLUMNS``' names)."""
        for name, dt in _COLUMNS:
            data = np.ascontiguousarray(columns[name], dtype=dt)
            if os.pwrite(self._fh.fileno(), data, self._at[name] + dt.itemsize * r0) != data.nbytes:
                raise OSError(f"{self._tmp}: short write")

    def rows(self, r0: int, r1: int) -> Segments:
        """Rows ``[r0, r1)`` of the table, as put."""
        return Segments(paths=self.paths, **_columns(self._fh.fileno(), self._at, r0, r1, name=self._tmp))

    def finish(self, *, name: str, groups: SplitGroups, plan: SplitPlan | None) -> None:
        """The groups, removals and shard plan (None: not planned) after the table; the file in place."""
        drops = [np.zeros(0, _U8) if d is None else np.asarray(d, _U8) for d in groups.drops]
        drop_at = np.concatenate([[0], np.cumsum([len(d) for d in drops], dtype=np.int64)]).astype(_I8)
        n_groups = len(groups.bounds) - 1
        header = {"name": name, "groups": n_groups, "rows": self.n_rows, "drops": int(drop_at[-1]),
                  "removals": any(d is not None for d in groups.drops),
                  "plan": None if plan is None else {"bounds": plan.bounds, "weights": plan.weights},
                  "paths": [Path(p).name for p in self.paths]}
        head = orjson.dumps(header)
        arrays = [np.asarray(groups.bounds, _I8), np.asarray(groups.starts, _I8), drop_at,
                  np.asarray(groups.drop_bytes or [0] * n_groups, _I8), *drops]
        fh = self._fh
        fh.seek(self._at["end"])
        fh.write(len(head).to_bytes(8, "little") + head)
        for a in arrays:
            fh.write(memoryview(a).cast("B"))
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        os.replace(self._tmp, self.path)
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._fh.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()

    def __enter__(self) -> PlanFile:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is not None or not self._fh.closed:
            self.abort()


def _columns_at(rows: int) -> dict[str, int]:
    """Where each column of a table of ``rows`` starts in a plan file, and where the table ends."""
    at, out = len(MAGIC) + 8, {}
    for name, dt in _COLUMNS:
        out[name] = at
        at += dt.itemsize * rows
    out["end"] = at
    return out


def _columns(fd: int, at: dict[str, int], r0: int, r1: int, *, name: Any) -> dict[str, np.ndarray]:
    cols = {}
    for column, dt in _COLUMNS:
        data = os.pread(fd, dt.itemsize * (r1 - r0), at[column] + dt.itemsize * r0)
        if len(data) != dt.itemsize * (r1 - r0):
            raise DatasetError(f"{name}: the plan file is cut short: remove it, then run --stage plan again")
        cols[column] = np.frombuffer(data, dtype=dt).astype(dt.newbyteorder("="))
    return cols


def write_index(work: Path, fp: str, splits: Sequence[Any], plans: list[SplitPlan | None],
                results: list[TaskResult]) -> None:
    """Every task's result, then the index: the run's plan complete (each split's size and shards)."""
    atomic_write_bytes(results_path(work, fp), orjson.dumps([dataclasses.asdict(r) for r in results]))
    atomic_write_bytes(index_path(work, fp), orjson.dumps({
        "splits": [{"name": s.name, "samples": s.samples, "shards": None if p is None else p.shards}
                   for s, p in zip(splits, plans)]}))


@dataclass(frozen=True)
class SplitSize:
    """A split as finalize needs it: its name and samples."""

    name: str
    samples: int


class PlannedSplit:
    """One split's plan file: its header and per-group arrays read, its segment rows on demand."""

    def __init__(self, *, path: Path, work: Path, origins: OriginIndex | None,
                 paths: dict[tuple[str, ...], list[str]] | None = None) -> None:
        self.path, self.work, self.origins = path, work, origins
        self._paths = {} if paths is None else paths  # one list for every split naming the same parts
        try:
            with open(path, "rb") as fh:
                if fh.read(len(MAGIC)) != MAGIC:
                    raise ValueError("not a plan file")
                self._at = _columns_at(int.from_bytes(fh.read(8), "little"))
                fh.seek(self._at["end"])
                self.header = orjson.loads(fh.read(int.from_bytes(fh.read(8), "little")))
                groups = int(self.header["groups"])
                small = {name: _read(fh, _I8, groups + 1) for name in _GROUP}
                self.drop_bytes = _read(fh, _I8, groups).tolist()
                self._drops_at = fh.tell()
        except (OSError, ValueError, KeyError) as exc:
            raise DatasetError(f"{path}: the plan file is unreadable ({exc}): remove it, then run --stage plan "
                               f"again") from None
        self.bounds, self.starts, self.drop_at = small["bounds"], small["starts"], small["drop_at"]
        plan = self.header["plan"]
        self.plan = None if plan is None else SplitPlan(bounds=plan["bounds"], weights=plan["weights"])

    @property
    def name(self) -> str:
        return str(self.header["name"])

    @property
    def samples(self) -> int:
        return int(self.starts[-1])

    def table(self, g0: int, g1: int) -> SplitGather:
        """The split as a gather reads groups ``[g0, g1)`` of it: their rows of the segment table
        and their removals, read from the file (nothing of the other groups)."""
        r0, r1 = int(self.bounds[g0]), int(self.bounds[g1])
        with open(self.path, "rb") as fh:
            d0, d1 = int(self.drop_at[g0]), int(self.drop_at[g1])
            fh.seek(self._drops_at + _U8.itemsize * d0)
            flat = _read(fh, _U8, d1 - d0)
            cols = _columns(fh.fileno(), self._at, r0, r1, name=self.path)
        drops: list[np.ndarray | None] = [None] * (len(self.bounds) - 1)
        if self.header["removals"]:
            for g in range(g0, g1):
                a, b = int(self.drop_at[g]) - d0, int(self.drop_at[g + 1]) - d0
                drops[g] = flat[a:b] if b > a else None
        names = tuple(self.header["paths"])  # (the same list object: a gather joins its splits' segments)
        paths = self._paths.setdefault(names, [str(self.work / p) for p in names])
        return SplitGather(name=self.name, segments=Segments(paths=paths, **cols), bounds=self.bounds,
                           starts=self.starts, drops=drops if self.header["removals"] else [],
                           drop_bytes=self.drop_bytes, origins=self.origins, window=(g0, g1))


def _read(fh: Any, dtype: np.dtype, n: int) -> np.ndarray:
    data = fh.read(dtype.itemsize * n)
    if len(data) != dtype.itemsize * n:
        raise ValueError("cut short")
    return np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="))


class PlannedRun:
    """A staged run's plan, as a gather unit or finalize reads it: the index, and each split's file
    opened when it is asked for."""

    def __init__(self, *, work: Path, fp: str, origins: OriginIndex | None = None) -> None:
        path = index_path(work, fp)
        try:
            index = orjson.loads(path.read_bytes())
        except (OSError, ValueError):
            raise UsageError("the plan of this run is not in the scratch folder: run --stage plan first (once, "
                             "after every scatter rank)") from None
        self.work, self.fp, self.origins = Path(work), fp, origins
        self.sizes = [SplitSize(name=s["name"], samples=int(s["samples"])) for s in index["splits"]]
        self._open: dict[int, PlannedSplit] = {}
        self._paths: dict[tuple[str, ...], list[str]] = {}

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sizes]

    def results(self) -> list[TaskResult]:
        """Every scatter task's result (finalize's: a gather unit needs none)."""
        path = results_path(self.work, self.fp)
        try:
            return [TaskResult(**r) for r in orjson.loads(path.read_bytes())]
        except (OSError, ValueError, TypeError) as exc:
            raise DatasetError(f"{path}: unreadable ({exc}): remove it, then run --stage plan again") from None

    def split(self, s: int) -> PlannedSplit:
        if s not in self._open:
            self._open[s] = PlannedSplit(path=split_path(self.work, self.fp, self.sizes[s].name), work=self.work,
                                         origins=self.origins, paths=self._paths)
        return self._open[s]

    # the gather's view of a run's splits (``gather.SplitSource``)
    def starts(self, s: int) -> np.ndarray:
        return self.split(s).starts

    def plan(self, s: int, writer: Any) -> SplitPlan:
        plan = self.split(s).plan
        if plan is None:  # the plan unit plans every split whose writer can share it (``Writer.rangeable``)
            raise AssertionError(f"split {self.sizes[s].name}: planned by a gather, not by the plan unit")
        return plan

    def table(self, s: int, g0: int, g1: int) -> SplitGather:
        return self.split(s).table(g0, g1)
