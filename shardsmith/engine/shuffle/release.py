"""The spill given back as the gather goes (issue 31): a gather range records each shard it finishes
(a piece of its own, ``piece-{split}-{k}-{k+1}.json``), so that a killed gather resumes after its
last finished shard, and then punches out of the part files the bytes that only finished shards
read (``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)``): the disk and the page cache get
them back at once, not when the spill folder is removed at the end. Any writer that can record a
shard alone takes part (``Writer.shards_alone``), with any ``--workers``: one gather worker writes
the split as one planned range (``shard_plan.planned``), and the gather tells the writer where each
planned shard ends (``Writer.shard_full``), so a shard is recorded as soon as its last sample is in.

What is punched is never read again, by this run or a resumed one: a bucket group is punched only
when every shard that holds one of its samples has its piece (written, fsynced and renamed first),
and only by the range that holds the whole group (a group that straddles two ranges, which two
workers or ranks read, is left to the spill's removal). Resumed ranges start after their finished
shards (``resume_at``) and the plan is read back, never recomputed from punched heads
(``released_mark``). Each punch is aligned inward to the file system's blocks, so no byte of a
neighbouring group is touched; footers, after the last segment, never are. A part's released spans
are punched in a few large runs (``PUNCHES_PER_PART``), not a hole a group: a part punched in a
hole for each of its groups has as many extents, and removing the spill folder at the end then took
seconds a file (43 s for 512 parts at 10 GB on 32 ranks, bench/README). Linux only; elsewhere,
or on a file system without hole punching, nothing is punched and the spill goes at the end as before.

Who takes part: HDF5, tars, event tars and token shards, with any ``--workers``; ``--nanogpt``'s
``train.bin`` (written in pieces of ranges) and memmap arrays (one writer a split) do not. A rerun
of a killed gather writes only the shards without a record: the output folder keeps the same run's
finished shards, and the group budget is pinned (``group-budget.json``), so nothing punched is read
again, whatever ``--workers`` the rerun has. A piece is trusted while every file it vouches for has
its size: its shards' files and their companions (every field of a shard's record that is a file
entry), the ``files`` it names, and the ``stretches`` of a split-wide file the ranges fill at once
(``kit/writer.py``; ``engine/shuffle/pieces.py`` checks them and names no format's file). A shard recorded
and then removed or changed (by hand, or an S3 output's staging folder cleared) would have to be written again from punched bytes: the
run starts afresh instead (``spill_lost``, checked when the scratch folder is taken over; a
cluster rank refuses in one line).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import sys
from collections.abc import Sequence
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import orjson

from shardsmith.core.faults import crash_point
from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.engine.shuffle.open_parts import OpenParts
from shardsmith.engine.shuffle.pieces import piece_intact, piece_path, piece_state
from shardsmith.engine.shuffle.segments import Segments
from shardsmith.engine.shuffle.split_gather import SplitGather
from shardsmith.kit.writer import Writer

_PUNCH_HOLE, _KEEP_SIZE = 0x02, 0x01
_state: dict[str, Any] = {}


def _fallocate() -> Any:
    """libc's fallocate (64-bit offsets), or None off Linux."""
    if "fn" not in _state:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fn = getattr(libc, "fallocate64", None) or libc.fallocate
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _state["fn"] = fn
    return _state["fn"]


def supported() -> bool:
    return _fallocate() is not None and not _state.get("refused")


ENABLED = True  # punch out the spill that only finished shards read (False: the spill goes at the end)
# a part's released spans wait until they make an eighth of it, then go in one punch (adjacent spans merged)
PUNCHES_PER_PART = 8


def gives_back(writer: Writer) -> bool:
    """Whether a gather by this writer gives its spill back as it goes: it can record each shard
    alone (``Writer.shards_alone``) and this file system punches holes."""
    return ENABLED and writer.shards_alone and supported()


def punch(path: str, ranges: Sequence[tuple[int, int]], *, fd: int | None = None) -> int:
    """Punch ``[start, stop)`` ranges of a file, each shrunk inward to whole blocks; returns the
    bytes punched (0 where hole punching is not available: a no-op). ``fd``: the file open for
    writing already (left open), else it is opened here."""
    fn = _fallocate()
    if fn is None or _state.get("refused") or not ranges:
        return 0
    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_WRONLY)
    try:
        block = max(os.fstat(fd).st_blksize, 4096)
        done = 0
        for start, stop in ranges:
            first, last = -(-start // block) * block, stop // block * block
            if last <= first:
                continue
            if fn(fd, _PUNCH_HOLE | _KEEP_SIZE, first, last - first) != 0:
                err = ctypes.get_errno()
                if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    _state["refused"] = True  # this file system cannot: keep the spill to the end
                    return done
                raise OSError(err, f"{path}: cannot release the spill's bytes {first}..{last}: {os.strerror(err)}")
            done += last - first
        return done
    finally:
        if own:
            os.close(fd)


def group_ranges(segments: Segments) -> dict[str, list[tuple[int, int]]]:
    """Per part file, the byte ranges the segments (heads and payloads) take, adjacent ones merged."""
    by_path: dict[str, list[tuple[int, int]]] = {}
    kept = segments[segments.count > 0]
    for p, a, b in zip(kept.part.tolist(), kept.offset.tolist(), (kept.offset + kept.nbytes).tolist()):
        by_path.setdefault(kept.paths[p], []).append((a, b))
    return {path: _merged(spans) for path, spans in by_path.items()}


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte ranges in order, those that touch or overlap made one."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def pinned_budget(work_dir: Path, budget: int) -> int:
    """The gather's bucket-group budget, the same for every run of the scratch folder: the first
    gather records it (before any punch), a rerun with other ``--workers`` (whose share of memory
    differs) reads the groups of the run it resumes, never a group of which a part was punched."""
    path = Path(work_dir) / "group-budget.json"
    try:
        return int(orjson.loads(path.read_bytes()))
    except (OSError, ValueError, TypeError):
        atomic_write_bytes(path, orjson.dumps(budget))
        return budget


def released_mark(work_dir: Path, split: str) -> Path:
    """Made before the first punch of a split: its plan may no longer be computed from the parts."""
    return work_dir / f"released-{split}"


def spill_lost(work_dir: Path, out_dir: Path) -> list[str]:
    """The splits whose spill was given back while a shard recorded from it is gone from ``out_dir``
    or changed (removed by hand or by ``--overwrite``; a staging folder cleared): a resumed gather
    would have to write that shard again from bytes that are no longer there, so the run starts
    afresh instead."""
    lost = []
    for mark in sorted(Path(work_dir).glob("released-*")):
        split = mark.name[len("released-"):]
        spans = [re.fullmatch(rf"piece-{re.escape(split)}-(\d+)-(\d+)\.json", p.name)
                 for p in Path(work_dir).glob(f"piece-{glob_escape(split)}-*.json")]  # (not a longer name's)
        if any(piece_state(work_dir, out_dir, split, int(m[1]), int(m[2])) is False for m in spans if m):
            lost.append(split)
    return lost


def found(work_dir: Path, out_dir: Path, split: str, first: int, stop: int) -> tuple[int, bool]:
    """What a killed run of the same command left of shards ``[first, stop)``, read once before the
    range is written: how many it finished (the range's piece, or its shards recorded one by one,
    intact), and whether one it recorded is gone or changed while the spill behind it is given back
    (``spill_lost`` for one rank's range: the pieces of other ranks, downloaded with an S3 stage's
    records, name shards of their own staging folders)."""
    whole = piece_state(work_dir, out_dir, split, first, stop)
    alone = [piece_state(work_dir, out_dir, split, k, k + 1) for k in range(first, stop)]
    kept = stop - first if whole else sum(1 for state in alone if state)
    return kept, False in (whole, *alone) and released_mark(work_dir, split).exists()


def finished(work_dir: Path, out_dir: Path, split: str, first: int, stop: int) -> list[bool]:
    """Which shards of ``[first, stop)`` a killed run finished, each recorded on its own (and its
    files still whole): a rerun writes only the others."""
    return [piece_intact(work_dir, out_dir, split, k, k + 1) for k in range(first, stop)]


def to_write(first: int, done: list[bool]) -> list[tuple[int, int]]:
    """The runs ``[begin, end)`` of unfinished shards, each written by a writer of its own (it starts
    at a planned boundary and ends before a finished shard)."""
    runs: list[tuple[int, int]] = []
    for i, d in enumerate(done):
        if d:
            continue
        if runs and runs[-1][1] == first + i:
            runs[-1] = (runs[-1][0], first + i + 1)
        else:
            runs.append((first + i, first + i + 1))
    return runs


class Release:
    """One gather range's bookkeeping: record each shard its writers finish, then punch the groups
    that lie wholly in the range and hold samples of finished shards only. ``bounds``: the plan's
    shard starts; ``starts``: each group's first sample, then the split's end; ``done``: the
    range's shards a killed run finished."""

    def __init__(self, *, split: SplitGather, starts: list[int], bounds: list[int], first: int, done: list[bool],
                 work_dir: Path, enabled: bool, parts: OpenParts | None = None) -> None:
        self.table, self.split, self.starts, self.bounds = split, split.name, starts, bounds
        self.parts = parts  # the range's part files, open (for writing, when it gives spill back)
        self.first, self.done, self.work_dir = first, list(done), work_dir
        self.enabled = enabled and supported()
        self.begin = self.recorded = 0  # the writer at work: its first shard, its shards recorded so far
        lo = bounds[first]
        # the first group wholly inside the range: one that starts before it is shared with the range before
        self.next = next((g for g, s in enumerate(starts[:-1]) if s >= lo), split.groups)
        self.punched = 0
        self._waiting: dict[str, list[tuple[int, int]]] = {}  # per part: released spans not punched yet
        self._sizes: dict[str, int] = {}  # per part: its size (read once: a part never changes while gathered)

    def writing(self, begin: int) -> None:
        """A writer starts at shard ``begin``."""
        self.begin, self.recorded = begin, 0

    def after(self, writer: Writer) -> None:
        """Record the writer's newly finished shards, then punch what only finished shards read."""
        writer.settle()
        made = len(writer.shards)
        if made == self.recorded:
            return
        for i in range(self.recorded, made):
            piece = writer.shard_piece(i)
            k = self.begin + i
            if piece is None:
                self.enabled = False
            else:
                atomic_write_bytes(piece_path(self.work_dir, self.split, k, k + 1),
                                   orjson.dumps({**piece, "stop": k + 1, "whole": False}))
            self.done[k - self.first] = True
        newly, self.recorded = range(self.begin + self.recorded, self.begin + made), made
        if self.enabled:
            self._punch()
        for k in newly:  # the tests' kill points: shard k recorded, the spill it alone read punched out
            crash_point(f"released:{self.split}:{k}")

    def _punch(self) -> None:
        unfinished = next((i for i, d in enumerate(self.done) if not d), len(self.done))
        reach = self.bounds[self.first + unfinished]  # every sample before it is in a finished shard
        last = self.next
        while last < self.table.groups and self.starts[last + 1] <= reach:
            last += 1
        if last == self.next:
            return
        mark = released_mark(self.work_dir, self.split)
        if not mark.exists():
            atomic_write_bytes(mark, b"")
        for path, spans in group_ranges(self.table.between(self.next, last)).items():
            waiting = _merged([*self._waiting.pop(path, []), *spans])
            size = self._sizes.get(path)
            if size is None:
                size = self._sizes[path] = os.stat(path).st_size
            if sum(b - a for a, b in waiting) * PUNCHES_PER_PART < size:
                self._waiting[path] = waiting  # (a smaller run: with the next ones)
                continue
            self.punched += punch(path, waiting, fd=None if self.parts is None else self.parts.writable_fd(path))
        self.next = last
