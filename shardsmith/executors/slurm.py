"""``--executor slurm``: the units as SLURM jobs, submitted through submitit, chained by the cluster.

The scatter units are one array job, the plan unit one job with ``afterok`` on it, the gather units a
second array with ``afterok`` on the plan, and finalize one job with ``afterok`` on the gather array;
all four are submitted at once, so the
cluster runs the chain even when nobody waits for it (``--no-wait``). A unit's pickle, logs and
result live in ``slurm-logs/shardsmith/JOBID/`` under the current folder, which every node must see
(as the inputs and the output).

A unit's own error is returned by ``run_remote`` as a value; here it is raised again (``SlurmUnit``)
so that the job fails and ``afterok`` (with ``--kill-on-invalid-dep=yes``) cancels the later stages.
The driver reads each job's result pickle as the job leaves the queue (``squeue``: submitit's own
state comes from ``sacct``, which needs the accounting database many clusters lack).

Requeue: every job is submitted with ``--requeue``. A preempted or ``scontrol requeue``d unit is
killed and run again from its pickle; a unit is idempotent (finished tasks and shards are kept), so
the rerun resumes. ``SlurmUnit`` is also checkpointable for submitit: on the USR2 SLURM sends
``signal_delay_s`` before the time limit (or a preemption signal) submitit requeues it itself, up to
``MAX_TIMEOUTS`` times for time limits.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardsmith.core.progress import Progress
from shardsmith.engine import Job, PrepareUnit, Unit, phases
from shardsmith.engine.output.outdir import complete_line
from shardsmith.errors import UsageError
from shardsmith.executors.base import (
    MissingExtra,
    UnitFailed,
    UnitOutcome,
    check_ranks,
    first_line,
    raise_first_failure,
    refuse_local_only,
    released_if_failed,
    remote_job,
    unit_order,
)
from shardsmith.executors.remote import run_remote

DEFAULT_RANKS = 4  # scatter and gather array tasks when --ranks is not given
DEFAULT_TIME_MIN = 240  # each job's --time unless --slurm-arg=--time=... (the recipes' templates' 4 h)
MAX_TIMEOUTS = 3  # requeues after a time limit (submitit's countdown); preemptions are not counted
LOGS = Path("slurm-logs/shardsmith")
POLL_S = (0.5, 5.0)  # squeue every 0.5 s, slowing down to every 5 s while nothing changes
CONTROLLER_PATIENCE_S = 60.0  # squeue failing this long (each call at most 30 s): one line and exit 1
RESULT_GRACE_S = 30.0  # a job out of the queue whose result file has not appeared yet (a slow shared FS)
SQUEUE_TIMEOUT_S = 30.0
# a job in none of these states, or out of squeue's list, is over (squeue -t all keeps them a few minutes)
OVER = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                  "DEADLINE", "PREEMPTED"})
# options the executor sets itself: given through --slurm-arg they would break the chain or the logs
_OURS = frozenset({"array", "dependency", "output", "error", "open_mode", "parsable", "wrap", "kill_on_invalid_dep"})


class _ControllerLost(UnitFailed):
    """squeue has not answered for the patience: the jobs are left as they are (and their folder)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, resumable=True)


class SlurmUnitError(Exception):
    """A unit's own error, raised in its job so that the job fails: ``[exit CODE] LINE``."""


class SlurmUnit:
    """What each SLURM job runs: ``run_remote``, its error raised (the job must fail for ``afterok``).
    Checkpointable for submitit (``checkpoint``): a unit resumes from its finished work, so the
    requeued job simply runs the same unit again."""

    def __call__(self, job: Job, unit: Unit, cwd: str) -> UnitOutcome:
        outcome = run_remote(job, unit, cwd)
        if outcome.error is not None:
            raise SlurmUnitError(f"[exit {outcome.exit_code}] {outcome.error}")
        return outcome

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


@dataclass(frozen=True, kw_only=True)
class _Stage:
    name: str
    units: list[Unit]
    jobs: list[Any]  # submitit SlurmJob, one per unit

    @property
    def job_id(self) -> str:
        """The array's id (``N`` of ``N_0``), or the one job's."""
        return str(self.jobs[0].job_id).split("_")[0]


class SlurmExecutor:
    """The job's units as four chained SLURM jobs (scatter array, plan, gather array, finalize)."""

    name = "slurm"

    def __init__(self, *, ranks: int | None = None, wait: bool = True, slurm_args: Sequence[str] = (),
                 folder: Path | str | None = None, controller_patience_s: float | None = None) -> None:
        check_ranks(ranks)
        self.ranks = ranks or DEFAULT_RANKS
        self.wait = wait
        self.sbatch_options, self.time_min = parse_slurm_args(slurm_args)
        self.folder = Path(folder) if folder is not None else None
        self.controller_patience_s = CONTROLLER_PATIENCE_S if controller_patience_s is None else controller_patience_s
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise MissingExtra(executor="slurm", module="submitit") from None
        if shutil.which("sbatch") is None:
            raise UsageError("--executor slurm: sbatch not found on PATH: run where SLURM jobs are submitted "
                             "(a login node), or choose --executor local")

    def run(self, job: Job) -> dict[str, Any]:
        progress = Progress(quiet=job.opts.quiet)
        refuse_local_only(job, executor=self.name)
        with released_if_failed(job) as claim:
            # the first unit here, where the command runs (it sees the shared folder): a folder that needs
            # --overwrite, or a dataset this very command finished, is said now, before anything is queued
            prepared = run_remote(remote_job(job), PrepareUnit(world=self.ranks), os.getcwd())
            raise_first_failure([prepared])
            if "stage" not in (prepared.result or {}):
                progress.note(complete_line(job.out, left=None))
                return prepared.result or {}
            claim.claimed = True
            stages = self.submit(job)
            ids = [s.job_id for s in stages]
            submitted = {s.name: s.job_id for s in stages}
            if not self.wait:
                return {"submitted": submitted, "ranks": self.ranks, "logs": str(self._folder())}
            progress.note(f"slurm: {submitted_line(submitted, self.ranks)}; logs in {self._folder()}/")
            try:
                result: dict[str, Any] = {}
                for stage in stages:
                    result = self._wait_stage(stage, stages, progress)[-1].result or {}
                return result
            except _ControllerLost:  # nothing to cancel through a controller that does not answer
                raise
            except BaseException:  # a failed unit, Ctrl-C: the rest of the chain goes (finished work is kept)
                _cancel(ids)
                raise

    # submitting
    def _folder(self) -> Path:
        return (self.folder or Path.cwd() / LOGS).absolute()

    def submit(self, job: Job) -> list[_Stage]:
        """The four jobs, each after the one before (``afterok``), submitted now."""
        import submitit

        executor = submitit.SlurmExecutor(folder=self._folder() / "%j", max_num_timeout=MAX_TIMEOUTS)
        extra = {"requeue": True, "kill_on_invalid_dep": "yes", **self.sbatch_options}
        executor.update_parameters(time=self.time_min, cpus_per_task=max(1, job.opts.workers or 1),
                                   additional_parameters=extra)
        remote, cwd = remote_job(job), os.getcwd()
        stages: list[_Stage] = []
        for units in phases(self.ranks)[1:]:  # the prepare unit ran here (``run``)
            name = units[0].stage
            after = {"dependency": f"afterok:{stages[-1].job_id}"} if stages else {}
            executor.update_parameters(job_name=f"shardsmith-{name}", **after)
            try:
                jobs = executor.map_array(SlurmUnit(), [remote] * len(units), units, [cwd] * len(units))
            except Exception as exc:  # sbatch refused it (an unknown option, partition, account)
                _cancel([s.job_id for s in stages])
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                raise UsageError(f"--executor slurm: sbatch refused the {name} job: "
                                 f"{lines[-1] if lines else type(exc).__name__}") from None
            stages.append(_Stage(name=name, units=list(units), jobs=list(jobs)))
        return stages

    # waiting
    def _wait_stage(self, stage: _Stage, chain: list[_Stage], progress: Progress) -> list[UnitOutcome]:
        pending = {str(j.job_id): (u, j) for u, j in zip(stage.units, stage.jobs)}
        outcomes: list[UnitOutcome] = []
        left_at: dict[str, float] = {}  # job id -> when it was first seen out of the queue without a result
        queue = _Queue(patience_s=self.controller_patience_s, ids=[s.job_id for s in chain])
        delay = POLL_S[0]
        with progress.bar(total=len(pending), desc=f"slurm {stage.name}", unit="unit") as bar:
            while pending:
                states = queue.states([stage.job_id])
                before = len(pending)
                for job_id, (unit, sjob) in list(pending.items()):
                    if job_id in states and states[job_id] not in OVER:  # queued, running, or requeued
                        left_at.pop(job_id, None)
                        continue
                    outcome = _outcome(unit, sjob)
                    if outcome is None:
                        first = left_at.setdefault(job_id, time.monotonic())
                        if time.monotonic() - first < RESULT_GRACE_S:
                            continue
                        outcome = UnitOutcome(unit=unit, exit_code=1, lost=True, error=(
                            f"SLURM job {job_id} ended without a result ({_final_state(job_id)}); "
                            f"its log: {sjob.paths.stderr}"))
                    del pending[job_id]
                    outcomes.append(outcome)
                    bar.update(1)
                raise_first_failure(outcomes)
                if pending:
                    delay = POLL_S[0] if len(pending) < before else min(POLL_S[1], delay * 1.5)
                    time.sleep(delay)
        return sorted(outcomes, key=lambda o: unit_order(o.unit))


def _outcome(unit: Unit, sjob: Any) -> UnitOutcome | None:
    """The unit's outcome from its job's result file; None while there is none."""
    from submitit.core.utils import pickle_load

    path = Path(sjob.paths.result_pickle)
    if not path.exists():
        return None
    kind, value = pickle_load(path)
    if kind == "success":
        return value  # type: ignore[no-any-return]
    lines = [ln for ln in str(value).splitlines() if ln.strip()]
    last = lines[-1] if lines else "failed"
    if (own := re.search(r"SlurmUnitError: \[exit (\d+)\] (.*)$", last)) is not None:
        return UnitOutcome(unit=unit, error=own.group(2), exit_code=int(own.group(1)))
    return UnitOutcome(unit=unit, exit_code=1, error=f"the SLURM job {sjob.job_id} failed: {last} "
                       f"(log: {sjob.paths.stderr})")


class _Queue:
    """``squeue`` of this run's jobs, with a bound on how long the controller may fail to answer."""

    def __init__(self, *, patience_s: float, ids: list[str]) -> None:
        self.patience_s = patience_s
        self.ids = ids
        self.failing_since: float | None = None

    def states(self, ids: list[str]) -> dict[str, str]:
        """{"N_R" or "N": state} of the jobs the controller still knows (finished ones a few minutes)."""
        while True:
            try:
                res = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(ids)],
                                     capture_output=True, text=True,
                                     timeout=min(SQUEUE_TIMEOUT_S, max(1.0, self.patience_s)))
                why = first_line(RuntimeError(res.stderr)) if res.returncode else ""
            except (OSError, subprocess.TimeoutExpired) as exc:
                res, why = None, f"{type(exc).__name__}: {first_line(exc)}"
            if res is not None and (res.returncode == 0 or "Invalid job id" in res.stderr):
                self.failing_since = None
                return dict(line.split("|", 1) for line in res.stdout.split() if "|" in line)
            now = time.monotonic()
            self.failing_since = self.failing_since or now
            if now - self.failing_since >= self.patience_s:
                joined = ",".join(self.ids)
                raise _ControllerLost(f"--executor slurm: squeue has not answered for {self.patience_s:.0f} s ({why}); "
                                 f"the jobs may still run: squeue -j {joined}")
            time.sleep(min(2.0, self.patience_s / 10))


def _final_state(job_id: str) -> str:
    """``FAILED, exit 0:9`` from scontrol (it keeps finished jobs a few minutes), else "state unknown"."""
    try:
        res = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True,
                             timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return "state unknown"
    fields = dict(f.split("=", 1) for f in res.stdout.split() if "=" in f)
    return f"{fields['JobState']}, exit {fields.get('ExitCode', '?')}" if "JobState" in fields else "state unknown"


def _cancel(ids: list[str]) -> None:
    if ids:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["scancel", *ids], capture_output=True, timeout=SQUEUE_TIMEOUT_S, check=False)


def submitted_line(ids: dict[str, str], ranks: int) -> str:
    """``scatter job N (array 0-3), plan job P, gather job M (array 0-3), finalize job K; watch:
    squeue -j N,P,M,K``: each stage's job (an array where the stage has a unit a rank)."""
    units = {phase[0].stage: len(phase) for phase in phases(ranks)[1:]}
    jobs = [f"{name} job {i}" + (f" (array 0-{units[name] - 1})" if units.get(name, 1) > 1 else "")
            for name, i in ids.items()]
    return f"{', '.join(jobs)}; watch: squeue -j {','.join(ids.values())}"


def parse_slurm_args(args: Sequence[str]) -> tuple[dict[str, Any], int]:
    """``--slurm-arg`` values (``--key=value`` or ``--flag``) as submitit's extra sbatch parameters,
    and the time limit in minutes (submitit needs it to tell a time limit from a preemption)."""
    options: dict[str, Any] = {}
    for arg in args:
        match = re.fullmatch(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(.*))?", arg.strip(), re.S)
        if match is None or (match.group(2) is not None and "\n" in match.group(2)):
            raise UsageError(f"--slurm-arg {arg!r}: give one long sbatch option, --key=value or --flag "
                             f"(e.g. --slurm-arg=--partition=cpu)")
        key = match.group(1).replace("-", "_")  # submitit's own names, so that the user's value wins
        if key in _OURS:
            raise UsageError(f"--slurm-arg {arg!r}: --executor slurm sets --{match.group(1)} itself")
        options[key] = True if match.group(2) is None else match.group(2)
    time_min = DEFAULT_TIME_MIN if "time" not in options else _minutes(str(options["time"]))
    return options, time_min


def _minutes(value: str) -> int:
    """sbatch's --time (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``) in whole minutes."""
    if value.strip().upper() in ("INFINITE", "UNLIMITED"):
        return 365 * 24 * 60
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value.strip())
    if match is None:
        raise UsageError(f"--slurm-arg=--time={value}: not a SLURM time (minutes, H:M:S or D-H:M:S)")
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # H:M:S
        seconds = a * 3600 + (b or 0) * 60 + c
    else:  # M or M:S
        seconds = a * 60 + (b or 0)
    return max(1, -(-seconds // 60))


__all__ = ["DEFAULT_RANKS", "SlurmExecutor", "SlurmUnit", "parse_slurm_args", "submitted_line"]
