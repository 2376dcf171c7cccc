"""``--executor ray``: one Ray Core task per unit (not Ray Data: its writes are not reproducible), on
the cluster at ``--address`` (``auto``: the one this machine's ``ray start`` joined; ``HOST:PORT``),
or on a Ray started for this run when none is given.

A task whose worker dies mid-unit is run again by Ray (``max_retries``); a unit's own error is not
retried (it returns as a value: the same inputs fail the same way).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardsmith.engine.job import Job
from shardsmith.engine.units import Unit
from shardsmith.errors import UsageError
from shardsmith.executors.base import MissingExtra, PhasedExecutor, UnitOutcome, first_line
from shardsmith.executors.remote import run_remote

MAX_RETRIES = 3


class RayExecutor(PhasedExecutor):
    """The units as Ray tasks of one CPU each."""

    name = "ray"

    def __init__(self, *, ranks: int | None = None, address: str | None = None, max_retries: int = MAX_RETRIES) -> None:
        super().__init__(ranks=ranks)
        self.address = address
        self.max_retries = max_retries

    @contextlib.contextmanager
    def session(self) -> Iterator[Any]:
        try:
            import ray
        except ImportError:
            raise MissingExtra(executor="ray", module="ray") from None
        if ray.is_initialized():  # the caller's own ray.init(): theirs to end
            yield ray
            return
        try:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self.address or "a new local cluster"
            raise UsageError(f"--executor ray: could not join {where} ({first_line(exc)})") from None
        try:
            yield ray
        finally:
            ray.shutdown()

    def default_ranks(self) -> int:
        import ray

        return int(ray.cluster_resources().get("CPU", 1))

    def map_units(self, job: Job, units: Sequence[Unit], done: Callable[[UnitOutcome], None]) -> None:
        import ray

        task = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(run_remote)
        job_ref, cwd = ray.put(job), os.getcwd()
        pending = {task.remote(job_ref, unit, cwd): unit for unit in units}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    unit = pending.pop(ref)
                    try:
                        outcome = ray.get(ref)
                    except Exception as exc:  # retries spent, or the cluster lost
                        outcome = UnitOutcome(unit=unit, error=f"the Ray task running it failed: "
                                              f"{type(exc).__name__}: {first_line(exc)}", exit_code=1, lost=True)
                    done(outcome)
                    if outcome.fatal:
                        return
        finally:
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)

