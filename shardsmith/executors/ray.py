"""``--executor ray``: one Ray Core task per unit (not Ray Data: its writes are not reproducible), on
the cluster at ``--address`` (``auto``: the one this machine's ``ray start`` joined; ``HOST:PORT``),
or on a Ray started for this run when none is given.

A task whose worker dies mid-unit is run again by Ray (``max_retries``); a unit's own error is not
retried (it returns as a value: the same inputs fail the same way).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardsmith.engine import Job, Unit
from shardsmith.errors import UsageError
from shardsmith.executors.base import MissingExtra, PhasedExecutor, UnitOutcome, first_line
from shardsmith.executors.remote import run_remote

MAX_RETRIES = 3
CONNECT_TIMEOUT_S = 5  # ray.init retries an unanswering GCS for minutes, printing a line every few seconds


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
        # no --address: a Ray of this run's own ("local"), never one that RAY_ADDRESS or an earlier
        # `ray start` on this machine names (that is what --address auto is for)
        address = self.address or "local"
        if address != "local":
            address = _check_answers(address)
        try:
            with _stderr_aside():
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
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



def _check_answers(address: str) -> str:
    """The address to join (``auto``: the one Ray itself picks, resolved once so that the check and the
    join agree), refused in one line within ``CONNECT_TIMEOUT_S`` where its GCS port does not accept
    a connection (ray.init would retry it for minutes)."""
    shown = address
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            with _stderr_aside():  # Ray's "Found multiple active Ray instances" and the like
                address = canonicalize_bootstrap_address("auto") or ""
        except Exception:  # no cluster found, or Ray's private helper moved: ray.init says why
            return "auto"
        shown = f"auto ({address})"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--address {address!r}: give HOST:PORT of the Ray head (its GCS port) or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"--executor ray: no Ray cluster answers at {shown} within {CONNECT_TIMEOUT_S} s "
                         f"({reason})") from None
    return address


@contextlib.contextmanager
def _stderr_aside() -> Iterator[None]:
    """File descriptor 2 into a scratch file while Ray connects: its C++ core writes warnings there
    before its logging is set up (``Failed to determine local IP ...`` where there is no default route),
    and the user should see our bars and lines, not Ray's start-up. Its failure comes back as an
    exception, which the caller turns into one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)
