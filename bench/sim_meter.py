"""What ``sim_exchange.py`` measures of a unit, and how (the same for a simulated unit and for a unit
of a real run: ``sim_check.py`` compares the two).

Each unit runs in a process of its own (forked from a parent that holds little but the imports),
so its peak memory and its counts are its own. ``Meter`` counts, over each phase of the unit:

- ``opens``: the files it opened in the scratch folder (a ``sys.addaudithook`` hook on ``open``
  events, which ``open``, ``os.open``, ``Path.read_bytes`` and numpy's file reads all raise), and
  of them ``part_opens``, those of part files (``part-*.bin`` and their temporary names);
- ``bytes_read`` / ``bytes_written``: what its read and write calls moved (``/proc/self/io``
  rchar and wchar, less the meter's own reads of ``/proc``); ``payload_read``: the payload bytes
  among them (counted where the engine reads a group: ``buckets._load_group``), so that
  ``bytes_read - payload_read`` is the metadata it read (footers, heads, plans, pieces, ...);
  ``holes_written``: bytes the real unit writes that the simulation leaves as holes (payloads,
  heads, the output shards: ``HoleFile``);
- ``cpu`` (user + system seconds) and ``wall``; and once per unit its peak resident memory
  (``VmHWM``, reset as the unit starts through ``/proc/self/clear_refs``).

Phases nest: a phase opened inside another counts for itself, and the outer one keeps the rest.
``instrument`` wraps the engine's own functions (never replacing them) so that a unit's phases are
the same wherever it runs: ``plan`` (``shard_plan.plan_split`` as the gather calls it), ``read``
(``gather.write_ranges``: the groups read, sorted and handed to the writer, the pieces recorded, the
spill punched), ``finish`` (``gather.finish`` in finalize); the rest of a gather unit or finalize is
``tables`` (the scratch folder, the footers, the tables).

An ``Exchange`` is one way of moving the samples from the scatter to the gather: today's
(``sim_today.py``), and the reworked one of issue 43 when it comes, as one more column of the table.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson
from sim_workload import Workload

_WATCH: dict[str, Any] = {"prefix": None, "opens": 0, "part_opens": 0, "hooked": False, "own": 0,
                          "payload_read": 0, "holes_written": 0, "instrumented": False}
COUNTS = ("opens", "part_opens", "bytes_read", "bytes_written", "payload_read", "holes_written", "cpu", "wall")


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or _WATCH["prefix"] is None or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.path.abspath(os.fsdecode(args[0]))
    if path.startswith(_WATCH["prefix"]):
        _WATCH["opens"] += 1
        if os.path.basename(path).lstrip(".").startswith("part-"):
            _WATCH["part_opens"] += 1


def _proc(name: str) -> bytes:
    """A file of ``/proc/self``, its bytes counted as the meter's own reads (not the unit's)."""
    with open(f"/proc/self/{name}", "rb") as fh:
        body = fh.read()
    _WATCH["own"] += len(body)
    return body


def _hwm() -> int:
    """This process's peak resident memory since the last reset, bytes."""
    for line in _proc("status").splitlines():
        if line.startswith(b"VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _snap() -> dict[str, float]:
    """The process's counters now (rchar less every byte the meter itself read before this read)."""
    own = _WATCH["own"]
    io = dict(line.split(b":") for line in _proc("io").splitlines())
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"opens": _WATCH["opens"], "part_opens": _WATCH["part_opens"], "bytes_read": int(io[b"rchar"]) - own,
            "bytes_written": int(io[b"wchar"]), "payload_read": _WATCH["payload_read"],
            "holes_written": _WATCH["holes_written"], "cpu": r.ru_utime + r.ru_stime, "wall": time.perf_counter()}


def count_holes(nbytes: int) -> None:
    """Bytes the real unit would write that the simulation leaves as holes (payloads, heads)."""
    _WATCH["holes_written"] += int(nbytes)


@dataclass
class _Frame:
    name: str
    start: dict[str, float]
    inner: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0.0))


class Meter:
    """The counts of one unit, phase by phase (in the unit's own process: ``in_child``)."""

    def __init__(self, scratch: Path) -> None:
        self.phases: dict[str, dict[str, float]] = {}
        self._stack: list[_Frame] = []
        self._peak: float | None = None
        with open("/proc/self/clear_refs", "w") as fh:  # the peak from here on, not the parent's
            fh.write("5")
        if not _WATCH["hooked"]:  # once a process (a hook cannot be removed)
            sys.addaudithook(_hook)
            _WATCH["hooked"] = True
        _WATCH["prefix"] = str(Path(scratch).resolve()) + os.sep

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count what the block does as phase ``name`` (phases of one name add up; a phase opened
        inside it counts for itself)."""
        frame = _Frame(name, _snap())
        self._stack.append(frame)
        try:
            yield
        finally:
            end = _snap()
            self._stack.pop()
            whole = {k: end[k] - frame.start[k] for k in COUNTS}
            into = self.phases.setdefault(name, dict.fromkeys(COUNTS, 0.0))
            for k in COUNTS:
                into[k] += whole[k] - frame.inner[k]
            if self._stack:
                for k in COUNTS:
                    self._stack[-1].inner[k] += whole[k]

    def unit_done(self) -> None:
        """The unit's peak memory is what it is now: what the simulation reads afterwards to reckon
        (every row of the plan) is not the unit's."""
        self._peak = _hwm()

    def report(self) -> dict[str, Any]:
        """The unit's phases and its peak resident memory."""
        return {"phases": self.phases, "rss": self._peak if self._peak is not None else _hwm()}


METRICS = ("opens", "meta_read", "rss", "cpu")  # a row's figures, in the table's order


def figure(counts: dict[str, float], metric: str) -> float:
    """One of ``METRICS`` (or a raw count) of a phase's or a unit's counts: metadata is what its
    read calls returned less the payload it read."""
    if metric == "meta_read":
        return counts["bytes_read"] - counts.get("payload_read", 0.0)
    if metric == "written":  # bytes written, and left as holes where the real unit writes them
        return counts["bytes_written"] + counts.get("holes_written", 0.0)
    return counts[metric]


def add_up(phases: list[dict[str, float]]) -> dict[str, float]:
    """Phases' counts added up."""
    return {k: sum(p.get(k, 0.0) for p in phases) for k in COUNTS}


# ---------------------------------------------------------------- the engine's functions, instrumented


class NotRun(Exception):
    """Raised instead of a function the unit is told not to run (``Captured.skip``)."""


@dataclass
class Captured:
    """What the instrumented functions returned in this unit (the tables, each split's plan), and
    the phases to leave out (``skip``: e.g. ``finish`` when the gather ranks not run left no pieces)."""

    meter: Meter | None = None
    splits: list[Any] = field(default_factory=list)
    plans: dict[str, Any] = field(default_factory=dict)
    punches: int = 0  # part files punched, a call each, to give back the spill of finished shards (``release.punch``)
    # False in the simulation: its parts are holes already, fragmented by the heads written into them,
    # and the kernel takes ~0.4 s to punch one such part (a real part: one extent, milliseconds)
    punch_holes: bool = True
    skip: set[str] = field(default_factory=set)


CAPTURED = Captured()


def _phase_of(name: str, fn: Callable[..., Any], keep: Callable[[Any, tuple[Any, ...]], None] | None = None
              ) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if name in CAPTURED.skip:
            raise NotRun(name)
        meter = CAPTURED.meter
        with meter.phase(name) if meter is not None else contextlib.nullcontext():
            out = fn(*args, **kwargs)
        if keep is not None:
            keep(out, args)
        return out

    return wrapped


def instrument(meter: Meter, *, skip: set[str] | frozenset[str] = frozenset(), punch_holes: bool = True) -> Captured:
    """Wrap the engine's functions that mark a unit's phases and count its payload reads (once a
    process; each wrapper calls the engine's own function with the same arguments), and point them
    at ``meter``. Returns what they capture. ``punch_holes`` False (the simulation): where the
    engine gives spill back (``release.punch``) the part is opened as it opens it, and nothing is
    punched (the one engine call the simulation does not make)."""
    from shardsmith.engine.shuffle import buckets, gather, release, run

    CAPTURED.meter, CAPTURED.skip, CAPTURED.punch_holes = meter, set(skip), punch_holes
    CAPTURED.splits, CAPTURED.plans, CAPTURED.punches = [], {}, 0
    if _WATCH["instrumented"]:
        return CAPTURED
    _WATCH["instrumented"] = True

    def keep_plan(plan: Any, args: tuple[Any, ...]) -> None:
        CAPTURED.plans[args[0].name] = plan

    def keep_splits(splits: Any, args: tuple[Any, ...]) -> None:
        CAPTURED.splits = splits

    gather.plan_split = _phase_of("plan", gather.plan_split, keep_plan)  # type: ignore[assignment]
    gather.write_ranges = _phase_of("read", gather.write_ranges)  # type: ignore[assignment]
    run.finish = _phase_of("finish", run.finish)  # type: ignore[assignment]
    split_tables = run.split_tables

    def tables(*args: Any, **kwargs: Any) -> Any:
        out = split_tables(*args, **kwargs)
        CAPTURED.splits = out
        return out

    run.split_tables = tables  # type: ignore[assignment]
    load_group = buckets._load_group

    def counted(group: list[Any], *, parts: Any, payloads: bool = True, into: Any = None) -> Any:
        out = load_group(group, parts=parts, payloads=payloads, into=into)
        if payloads:
            _WATCH["payload_read"] += group.payload_bytes
        return out

    buckets._load_group = counted  # type: ignore[assignment]
    punch = release.punch

    def punched(path: str, ranges: Any, *, fd: int | None = None) -> int:
        if not CAPTURED.punch_holes:  # the part opened as ``release.punch`` opens it (unless the range
            # holds it open already: ``fd``); its holes left as they are
            if not ranges or not release.supported():
                return 0
            if fd is None:
                os.close(os.open(path, os.O_WRONLY))
            CAPTURED.punches += 1
            return 0
        CAPTURED.punches += 1
        return punch(path, ranges, fd=fd)

    release.punch = punched  # type: ignore[assignment]
    return CAPTURED


class HoleFile:
    """``core.fsutil.HashingFile`` as the simulation's writers use it: the bytes handed to it are
    counted (``holes_written``), not written or hashed, and ``commit`` leaves the file in place as a
    hole of that size (what a piece records and ``pieces.is_intact`` checks: the size)."""

    def __init__(self, path: Path, **_: Any) -> None:
        self.path = Path(path)
        self.bytes = 0

    def write(self, data: Any) -> None:
        n = memoryview(data).nbytes
        self.bytes += n
        _WATCH["holes_written"] += n

    def commit(self) -> str:
        with open(self.path, "wb") as fh:
            fh.truncate(self.bytes)
        return "0" * 64  # not hashed: the bytes were never there

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def shards_as_holes() -> None:
    """pack-tokens' writer (``formats/tokens/writer.TokensWriter``) with ``HoleFile`` for its shard
    and index files: everything it does but write and hash the bytes (in this process only)."""
    from shardsmith.formats.tokens import writer

    writer.HashingFile = HoleFile  # type: ignore[assignment,misc]


# ---------------------------------------------------------------- units and exchanges


@dataclass(frozen=True)
class UnitRef:
    """One unit of a simulated run: its kind (scatter, plan, gather, finalize) and rank."""

    kind: str
    rank: int = 0

    @property
    def label(self) -> str:
        return self.kind if self.kind in ("plan", "finalize") else f"{self.kind} {self.rank}"


@dataclass(frozen=True)
class Row:
    """A row of the table: the unit ``kind`` (the busiest of the measured ranks), or only its
    ``phase`` on rank ``rank`` (today's plan is made inside the first gather unit)."""

    label: str
    kind: str
    phase: str | None = None
    rank: int | None = None
    note: str = ""


@dataclass(frozen=True)
class Law:
    """How one figure of a row grows: ``metric`` of ``phase`` (None: the whole unit) against the
    counted ``predictor``, fitted over the measured units: a + b . x (+ ``exact``)."""

    row: str
    metric: str
    phase: str | None
    predictor: str  # counts of the unit, "+"-separated ("": a constant)
    exact: str = ""  # a count the metric holds whole (coefficient 1: the heads a read asks for), not fitted

    @property
    def names(self) -> list[str]:
        return [n for n in self.predictor.split("+") if n]


@dataclass
class Paths:
    """Where a simulated run lives: the dataset folder and its scratch folder beside it."""

    out: Path
    scratch: Path


class Exchange(ABC):
    """One way of moving the samples from the scatter to the gather, simulated: no payload is read
    or written, every plan and table is made by the engine's (or the new exchange's) own code.

    To put another exchange beside today's: subclass this, name it, give its ``rows`` the labels of
    today's where they mean the same unit (scatter, plan, gather, finalize), and register it in
    ``sim_exchange.EXCHANGES``; ``--exchange today,NAME`` prints both side by side."""

    name: ClassVar[str]
    rows: ClassVar[tuple[Row, ...]]
    laws: ClassVar[tuple[Law, ...]]

    def prepare(self, wl: Workload, *, sample: int) -> dict[str, Any]:
        """What the units of ``wl`` need to know before the scatter (JSON; in a process of its own,
        not measured): e.g. where the plan will cut, whose heads the scatter must then write; and
        ``gather_ranks``, the ``sample`` gather units to measure (``pick_ranks``) besides those of
        ``setup_units`` (absent: chosen by ``pick_ranks`` from ``every_rank``)."""
        return {}

    @abstractmethod
    def setup_units(self, wl: Workload) -> list[UnitRef]:
        """The units that run before any sampled gather unit, in an order that works: every
        scatter unit (their parts are the input of the rest), then the one that plans (today's
        first gather unit; a plan unit). One of them returns ``every_rank`` among its counts: per
        gather rank, what its unit would count (``pairs``: its opens of parts, ``heads``,
        ``payload``, ``docs``, ``tokens`` written, ``ranges``), from the exchange's own tables and
        plan, so the run's totals add up the ranks that are not run."""

    @abstractmethod
    def run_unit(self, wl: Workload, paths: Paths, unit: UnitRef, meter: Meter, prepared: dict[str, Any],
                 *, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Run one unit, its phases inside ``meter.phase``; returns what it counted itself (the
        predictors of ``laws`` for this unit). ``skip``: phases not to run (``finish`` where the
        gather ranks not run left no pieces)."""

    @abstractmethod
    def shape(self, wl: Workload, *, sample_tasks: int) -> dict[str, float]:
        """The predictors of ``laws`` at any size (the busiest gather rank's, and the run's totals),
        from the sizing rules and a sample of synthetic parts: what the fits extrapolate from."""


def pick_ranks(pairs: list[int], *, done: set[int], sample: int, every_up_to: int = 5) -> list[int]:
    """Gather ranks to measure besides ``done``, ``sample`` units in all: the busiest (most opens of
    part files, ``pairs``), the last rank (often one with no shard to write at the default shard
    size: what an idle rank pays), then the next busiest; every rank that reads (and the last) where
    they are at most ``every_up_to`` units (then finalize finds every piece and runs ``finish``)."""
    order = sorted((r for r in range(len(pairs)) if r not in done), key=lambda r: (-pairs[r], r))
    readers = {r for r in order if pairs[r]} | {len(pairs) - 1} - done
    if len(readers) + len(done) <= every_up_to:
        sample = max(sample, len(readers) + len(done))
    chosen = order[:1] + [r for r in [len(pairs) - 1] if r not in done and r not in order[:1]]
    chosen += [r for r in order if r not in chosen]
    return chosen[:max(0, sample - len(done))]


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked process; its JSON-able result, or a RuntimeError with its traceback."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        code = 0
        try:
            body = orjson.dumps({"ok": fn(*args)}, option=orjson.OPT_SERIALIZE_NUMPY)
        except BaseException:  # noqa: BLE001 (sent to the parent, which raises it)
            body, code = orjson.dumps({"error": traceback.format_exc()}), 1
        with os.fdopen(w, "wb") as fh:
            fh.write(body)
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        body = fh.read()
    _, status = os.waitpid(pid, 0)
    got = orjson.loads(body) if body else {"error": f"the unit's process ended with status {status}"}
    if "error" in got:
        raise RuntimeError(got["error"])
    return got["ok"]


def measured(exchange: Exchange, wl: Workload, paths: Paths, unit: UnitRef, prepared: dict[str, Any],
             *, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One unit run and measured in a process of its own: its phases, peak memory and own counts."""

    def body() -> dict[str, Any]:
        meter = Meter(paths.scratch)
        counted = exchange.run_unit(wl, paths, unit, meter, prepared, skip=skip)
        return {"unit": unit.label, "kind": unit.kind, "rank": unit.rank, **meter.report(), "counted": counted}

    return in_child(body)
