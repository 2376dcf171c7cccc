"""What ``sim_exchange.py`` measures of a unit, and what an exchange gives it to measure.

Each unit runs in a process of its own (forked from the simulation, which holds nothing but the
imports), so its peak memory and its counts are its own. ``Meter`` counts, over each phase of the
unit: the files it opens in the scratch folder (a ``sys.addaudithook`` hook on ``open`` events,
which ``open``, ``os.open``, ``Path.read_bytes`` and numpy's file reads all raise), the bytes its
read and write calls moved (``/proc/self/io`` rchar and wchar: no payload is ever read or written
in the simulation, so these are the metadata: footers, heads, plans), user + system CPU seconds,
and the peak resident memory (``VmHWM``, reset as the unit starts through ``/proc/self/clear_refs``).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson
from sim_workload import Workload

_WATCH: dict[str, Any] = {"prefix": None, "opens": 0, "hooked": False}


def _hook(event: str, args: tuple[Any, ...]) -> None:
    watched = event == "open" and _WATCH["prefix"] is not None and args
    if watched and isinstance(args[0], (str, bytes, os.PathLike)) and \
            os.path.abspath(os.fsdecode(args[0])).startswith(_WATCH["prefix"]):
        _WATCH["opens"] += 1




def _io() -> dict[str, int]:
    out = {}
    with open("/proc/self/io") as fh:
        for line in fh:
            key, value = line.split(":")
            out[key] = int(value)
    return out


def _hwm() -> int:
    """This process's peak resident memory since the last reset, bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Meter:
    """The counts of one unit, phase by phase (its own process: ``in_child``)."""

    def __init__(self, scratch: Path) -> None:
        self.phases: dict[str, dict[str, float]] = {}
        with open("/proc/self/clear_refs", "w") as fh:  # the peak from here on, not the parent's
            fh.write("5")
        if not _WATCH["hooked"]:  # once a process (in the unit's own: a hook cannot be removed)
            sys.addaudithook(_hook)
            _WATCH["hooked"] = True
        first = _io()["rchar"]
        self._own = _io()["rchar"] - first  # reading /proc/self/io is a read too: not the unit's
        _WATCH["prefix"] = str(Path(scratch).resolve()) + os.sep
        _WATCH["opens"] = 0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count what the block does as phase ``name`` (phases of one name add up)."""
        io, opens, cpu, wall = _io(), _WATCH["opens"], _cpu(), time.perf_counter()
        try:
            yield
        finally:
            after = _io()
            got = {"opens": _WATCH["opens"] - opens, "bytes_read": after["rchar"] - io["rchar"] - self._own,
                   "bytes_written": after["wchar"] - io["wchar"], "cpu": _cpu() - cpu,
                   "wall": time.perf_counter() - wall}
            into = self.phases.setdefault(name, {**dict.fromkeys(got, 0.0), **dict.fromkeys(PAYLOAD, 0.0)})
            for key, value in got.items():
                into[key] += value
            into["rss"] = _hwm()  # the unit's peak so far

    def payload(self, name: str, *, read: int = 0, written: int = 0) -> None:
        """The payload bytes phase ``name`` read (holes, read as zeros) or would have written (left
        as holes), counted by the exchange from its segments: what is not metadata of its I/O."""
        self.phases[name]["payload_read"] += read
        self.phases[name]["payload_written"] += written


PAYLOAD = ("payload_read", "payload_written")
METRICS = ("opens", "meta_read", "rss", "cpu")  # a row's figures, in the table's order


def figure(counts: dict[str, float], metric: str) -> float:
    """One of ``METRICS`` (or a raw count) of a phase's or a unit's counts: metadata is what its
    read calls returned less the payload it read."""
    if metric == "meta_read":
        return counts["bytes_read"] - counts.get("payload_read", 0.0)
    return counts[metric]


def add_up(phases: list[dict[str, float]]) -> dict[str, float]:
    """Phases' counts added up (the peak memory: the largest)."""
    if not phases:
        return {}
    out = {k: sum(p[k] for p in phases) for k in phases[0] if k != "rss"}
    out["rss"] = max(p["rss"] for p in phases)
    return out


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
    """One way of moving the samples from the scatter to the gather, simulated: no payload is
    read or written, every plan is the engine's (or the new exchange's) own code."""

    name: ClassVar[str]
    rows: ClassVar[tuple[Row, ...]]
    laws: ClassVar[tuple[Law, ...]]

    def prepare(self, wl: Workload) -> dict[str, Any]:
        """What the units of ``wl`` need to know before the scatter (JSON; in a process of its own,
        not measured): e.g. where the plan will cut, whose heads the scatter must then write."""
        return {}

    @abstractmethod
    def setup_units(self, wl: Workload) -> list[UnitRef]:
        """The units that run before any sampled gather unit, in an order that works: every
        scatter unit (their parts are the input of the rest), then the one that plans (today's
        first gather unit; a plan unit). One of them returns ``every_rank`` among its counts: per
        gather rank, what its unit would count (``pairs``: its opens of parts, ``heads``,
        ``payload``, ``docs``, ``tokens`` written), from the exchange's own tables and plan, so the
        run's totals add up the ranks that are not run."""

    @abstractmethod
    def run_unit(self, wl: Workload, paths: Paths, unit: UnitRef, meter: Meter, prepared: dict[str, Any]
                 ) -> dict[str, Any]:
        """Run one unit, its phases inside ``meter.phase``; returns what it counted itself (the
        predictors of ``laws`` for this unit, payload bytes it would read and write)."""

    @abstractmethod
    def shape(self, wl: Workload, *, sample_tasks: int) -> dict[str, float]:
        """The predictors of ``laws`` at any size (the busiest gather rank's, and the run's totals),
        from the sizing rules and a sample of synthetic parts: what the fits extrapolate from."""


def in_child(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a forked process; its JSON-able result, or a RuntimeError with its traceback."""
    r, w = os.pipe()
    sys.stdout.flush()
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


def measured(exchange: Exchange, wl: Workload, paths: Paths, unit: UnitRef, prepared: dict[str, Any]
             ) -> dict[str, Any]:
    """One unit run and measured in a process of its own: its phases and its own counts."""

    def body() -> dict[str, Any]:
        meter = Meter(paths.scratch)
        counted = exchange.run_unit(wl, paths, unit, meter, prepared)
        return {"unit": unit.label, "kind": unit.kind, "rank": unit.rank, "phases": meter.phases,
                "counted": counted}

    return in_child(body)
