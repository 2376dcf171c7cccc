"""What every executor shares: the phases in order, one progress bar per stage across its units, and
the first failure reported by its stage, rank and one line.

An engine's module only says how to run a list of units at once (``PhasedExecutor.map_units``) and
how many ranks it runs by default; the order, the bars and the errors are decided here, once.

``PhasedExecutor`` runs each phase's units at once (``units.phases``: a ``PrepareUnit`` that
claims the output as a local run does, with ``--overwrite``, "already complete" and another run's
scratch folder replaced; then scatter, plan, gather, finalize), draws one bar per stage and turns the
first failure into one line by stage and rank. Every unit runs as ``remote.run_remote(job, unit,
cwd)``, whose error comes back as a value, so the engine retries only what died. The units exchange
data through the output folder or bucket, never through the engine: task parts are per task and
shard ranges are planned from the parts, whatever the rank count, so the bytes depend on the job
alone. A unit that a killed driver left running holds its stage-and-rank lock
(``outlock.LockedError.same_unit``): the next driver waits for it instead of failing. The
``local`` executor is ``run_job``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from shardsmith.core.progress import Progress
from shardsmith.core.urls import is_url
from shardsmith.core.words import plural
from shardsmith.engine import FinalizeUnit, Job, PlanUnit, PrepareUnit, Unit, phases
from shardsmith.engine.output.outdir import complete_line
from shardsmith.engine.output.session import missing, release_failed
from shardsmith.errors import ShardsmithError, UsageError, install_hint

MAX_RANKS = 1 << 16
# a unit whose copy a killed driver left running is tried again every BUSY_POLL_S, up to BUSY_WAIT_S
BUSY_POLL_S = 2.0
BUSY_WAIT_S = 900.0
RELEASE_WAIT_S = 5.0  # a failed run waits this long at most for its stopped units to let go of the folder


class Executor(Protocol):
    """Runs a whole job somewhere; returns its manifest (or, not waiting, where the job stands)."""

    name: str

    def run(self, job: Job) -> dict[str, Any]: ...


class UnitFailed(ShardsmithError):
    """A unit of a job failed on a cluster: its stage, rank and first error line. ``resumable``: its
    process died or the engine lost it (not an error of the data or options): what the run finished
    is kept for the same command, as a local run that loses a worker keeps it."""

    def __init__(self, message: str, *, exit_code: int = 1, resumable: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.resumable = resumable


class MissingExtra(UsageError):
    """An executor whose engine is not installed: one line naming the extra to install."""

    def __init__(self, *, executor: str, module: str) -> None:
        super().__init__(f"--executor {executor} needs the {module} package: {install_hint(executor)}")


@dataclass(frozen=True, kw_only=True)
class UnitOutcome:
    """What comes back from a unit: its result (``run_unit``'s) or its one-line error, and its cost."""

    unit: Unit
    result: dict[str, Any] | None = None
    error: str | None = None
    exit_code: int = 0
    seconds: float = 0.0
    lost: bool = False  # the unit's process died or the engine lost it (not an error of the data or options)
    busy: bool = False  # the same unit of this job is still running elsewhere (left by a killed driver)

    @property
    def fatal(self) -> bool:
        """An error that ends the phase (a busy unit is run again once its other copy ends)."""
        return self.error is not None and not self.busy

    @property
    def bytes(self) -> int:
        """Input bytes the unit read (scatter), for the stage's MB/s; 0 where unknown."""
        return int((self.result or {}).get("bytes") or 0)


def unit_name(unit: Unit) -> str:
    """``scatter rank 2 of 4``, ``finalize``: how a unit is named to the user."""
    return unit.stage if isinstance(unit, FinalizeUnit | PrepareUnit | PlanUnit) else f"{unit.stage} rank {unit.rank} of {unit.world}"


def first_line(exc: BaseException) -> str:
    """An engine's exception, as one line."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_ranks(ranks: int | None) -> None:
    if ranks is not None and not (isinstance(ranks, int) and 1 <= ranks <= MAX_RANKS):
        raise UsageError(f"--ranks must be a whole number from 1 to {MAX_RANKS}, got {ranks!r}")


class PhasedExecutor:
    """An executor that runs the units of each phase at once on an engine, a phase after the one
    before, and stops at the first failed phase (naming its first failed unit, by rank)."""

    name = "?"

    def __init__(self, *, ranks: int | None = None) -> None:
        check_ranks(ranks)
        self.ranks = ranks
        self._busy: list[UnitOutcome] = []  # the phase's units found still running elsewhere

    # what an engine says
    def session(self) -> AbstractContextManager[Any]:
        """The engine, joined or started, for the length of the run (closed after, if started here)."""
        return nullcontext()

    def default_ranks(self) -> int:
        """The engine's choice of ranks when ``--ranks`` is not given (its workers or CPUs)."""
        return 1

    def map_units(self, job: Job, units: Sequence[Unit], done: Callable[[UnitOutcome], None]) -> None:
        """Run ``units`` of ``job`` at once, calling ``done`` with each one's outcome as it comes back
        (in any order); return when all have come back or the first failed one has."""
        raise NotImplementedError

    # the same for every engine
    def run(self, job: Job) -> dict[str, Any]:
        refuse_local_only(job, executor=self.name)
        progress = Progress(quiet=job.opts.quiet)
        with released_if_failed(job) as claim, self.session():
            world = self.ranks or max(1, self.default_ranks())
            remote = remote_job(job)
            result: dict[str, Any] = {}
            for units in phases(world):
                result = self._phase(remote, units, progress=progress)[-1].result or {}
                if isinstance(units[0], PrepareUnit):
                    if "stage" not in result:  # this very run's finished dataset
                        progress.note(complete_line(job.out, left=None))
                        break
                    claim.claimed = True
        return result

    def _phase(self, job: Job, units: Sequence[Unit], *, progress: Progress) -> list[UnitOutcome]:
        stage, todo = units[0].stage, list(units)
        outcomes: list[UnitOutcome] = []
        start, waited = time.monotonic(), 0.0
        with progress.bar(total=len(units), desc=f"{self.name} {stage}", unit="unit") as bar:
            def done(outcome: UnitOutcome) -> None:
                if outcome.busy:
                    self._busy.append(outcome)
                    return
                outcomes.append(outcome)
                bar.update(1)
                mb = sum(o.bytes for o in outcomes) / 1e6
                if mb:
                    bar.set_postfix_str(f"{mb / max(1e-3, time.monotonic() - start):.1f} MB/s")
            while todo:
                came = len(outcomes)
                self.map_units(job, todo, done)
                busy = [o for o in self._busy if o.unit in todo]
                self._busy = []
                if any(o.fatal for o in outcomes[came:]) or not busy:
                    break
                if waited >= BUSY_WAIT_S:  # still held: report it as it is
                    outcomes += [replace(o, busy=False) for o in busy]
                    break
                if not waited:
                    progress.note(f"{unit_name(busy[0].unit)}: waiting for what holds the output to end (a unit "
                                  f"a stopped run left running?): {busy[0].error}")
                time.sleep(BUSY_POLL_S)
                waited += BUSY_POLL_S
                todo = [o.unit for o in busy]
        raise_first_failure(outcomes)
        if len(outcomes) != len(units):  # an engine that returned early without a failure: a bug of ours
            raise UnitFailed(f"{stage}: {len(units) - len(outcomes):,} of {plural(len(units), 'unit')} never came back")
        return sorted(outcomes, key=lambda o: unit_order(o.unit))


def unit_order(unit: Unit) -> int:
    """Units of one phase in rank order (the one unit of prepare and finalize first)."""
    return 0 if isinstance(unit, FinalizeUnit | PrepareUnit | PlanUnit) else unit.rank


def raise_first_failure(outcomes: Sequence[UnitOutcome]) -> None:
    """The first failed unit by rank, as one line (how many more failed; whether a rerun resumes)."""
    failed = sorted((o for o in outcomes if o.error is not None), key=lambda o: unit_order(o.unit))
    if not failed:
        return
    first = failed[0]
    more = f" ({len(failed) - 1} more units failed)" if len(failed) > 1 else ""
    again = "; the same command resumes from the finished units" if first.lost else ""
    # the prepare unit's errors are the command's own (options, inputs, the output folder)
    who = "" if isinstance(first.unit, PrepareUnit) else f"{unit_name(first.unit)} failed: "
    raise UnitFailed(f"{who}{first.error}{more}{again}", exit_code=first.exit_code or 1, resumable=first.lost)


class Claim:
    """Whether an executor's run claimed its output folder (its prepare unit ran), and the folders
    it made; see ``released_if_failed``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.created = missing(out)  # before the prepare unit makes any
        self.claimed = False


@contextmanager
def released_if_failed(job: Job) -> Iterator[Claim]:
    """The driver's side of a failed run (enter it before the engine's session, so that the units
    have ended when it exits): a unit that failed on its data or options (or the driver, on an
    option of the engine's) releases what the run claimed (``engine.output.session.release_failed``), as
    a failed local run does; a lost unit, an interruption, or a failure before the claim (the
    folder may be another run's) keep everything. Set ``claimed`` once the prepare unit claimed it."""
    claim = Claim(Path(job.out).absolute())
    try:
        yield claim
    except ShardsmithError as exc:  # (an interruption is no ShardsmithError: it keeps everything)
        resumable = isinstance(exc, UnitFailed) and exc.resumable
        if claim.claimed and not resumable and not is_url(str(job.out)):
            deadline = time.monotonic() + RELEASE_WAIT_S
            # a unit a cluster was told to stop may hold the folder a moment longer (Ray kills its
            # worker, SLURM its job, after the call returns): waited for a little, never for long
            while not release_failed(claim.out, created=claim.created) and time.monotonic() < deadline:
                time.sleep(BUSY_POLL_S / 8)
        raise


def refuse_local_only(job: Job, *, executor: str) -> None:
    """What only a local run does, refused on ``executor`` in one line."""
    if job.opts.limit is not None:
        raise UsageError(f"--limit reads the first records in order, in one process: it runs with --executor "
                         f"local, not {executor}")


def remote_job(job: Job) -> Job:
    """The job as a remote unit runs it: quiet (the driver draws the bars)."""
    return replace(job, opts=replace(job.opts, quiet=True))

