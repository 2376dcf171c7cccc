"""``--executor dask``: one ``distributed`` future per unit, on a running scheduler (``--address
tcp://HOST:PORT``), on a ``Client`` made by the caller (a dask-jobqueue cluster: ``DaskExecutor(
client=Client(cluster))``), or on a ``LocalCluster`` of this machine's cores when neither is given.

A worker that dies mid-unit is the scheduler's to handle: it runs the unit again on another worker
(up to its ``allowed-failures``, then the unit fails with ``KilledWorker``, named here in one line).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardsmith.engine import Job, Unit
from shardsmith.errors import UsageError
from shardsmith.executors.base import MissingExtra, PhasedExecutor, UnitOutcome, first_line, unit_name
from shardsmith.executors.remote import run_remote

CONNECT_TIMEOUT_S = 5
# The level of the records a LocalCluster of ours lets through (``silence_logs``): none. Its worker
# processes write to our stderr, and the driver's one line says what happened to each unit; at
# ERROR, a worker whose heartbeat met the scheduler closing after a failed unit (it was still
# running a cancelled one) printed a 28-line traceback after that line, in some runs, by timing.
QUIET = logging.CRITICAL + 1


class DaskExecutor(PhasedExecutor):
    """The units as futures of a Dask ``distributed`` cluster."""

    name = "dask"

    def __init__(self, *, ranks: int | None = None, address: str | None = None, client: Any = None) -> None:
        super().__init__(ranks=ranks)
        self.address = address
        self.client = client

    @contextlib.contextmanager
    def session(self) -> Iterator[Any]:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise MissingExtra(executor="dask", module="distributed") from None
        _quiet_logs()
        if self.client is not None:
            yield self.client
            return
        if self.address:
            try:
                client = Client(self.address, timeout=CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError, ValueError) as exc:
                raise UsageError(f"--executor dask: no scheduler answers at {self.address} within "
                                 f"{CONNECT_TIMEOUT_S} s ({first_line(exc)})") from None
            with client:
                self.client = client
                try:
                    yield client
                finally:
                    self.client = None
            return
        # processes, one thread each: a unit owns its process while it runs (executors/remote.py); no
        # more of them than there are ranks to run
        workers = min(os.cpu_count() or 1, self.ranks or os.cpu_count() or 1)
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                          silence_logs=QUIET) as cluster, Client(cluster) as client:
            self.client = client
            try:
                yield client
            finally:
                self.client = None

    def default_ranks(self) -> int:
        return sum(self.client.nthreads().values()) or 1

    def map_units(self, job: Job, units: Sequence[Unit], done: Callable[[UnitOutcome], None]) -> None:
        from distributed import as_completed

        cwd = os.getcwd()
        futures = {self.client.submit(run_remote, job, unit, cwd, pure=False,
                                      key=f"shardsmith-{unit_name(unit).replace(' ', '-')}-{os.urandom(4).hex()}"): unit
                   for unit in units}
        try:
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except Exception as exc:  # the unit never came back (KilledWorker, a lost scheduler)
                    outcome = UnitOutcome(unit=futures[future], error=f"Dask lost it: "
                                          f"{type(exc).__name__}: {first_line(exc)}", exit_code=1, lost=True)
                done(outcome)
                if outcome.fatal:
                    return
        finally:
            self.client.cancel(list(futures))



def _quiet_logs() -> None:
    """The client's own log lines (a lost scheduler, its reconnecting, with tracebacks) would follow
    ours on stderr: the engine's logs stay on the cluster, the user gets our one line."""
    for name in [n for n in logging.root.manager.loggerDict if n == "distributed" or n.startswith("distributed.")]:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
