"""The one function an engine runs for a unit, in its own worker process: ``run_remote``.

It runs the unit in the folder the job was described in (relative inputs, ``-o`` and option files
mean there what they meant to the user), one unit at a time per process (a unit's run owns
process-wide state: the folder, the staging of URL inputs), and turns a failure into a value: the
unit's one-line error and exit code. An exception is left to the engine only where the engine
should retry: a worker that dies never returns, and the engine runs its unit again.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import replace

from shardsmith.engine import Job, PrepareUnit, Unit, run_unit
from shardsmith.engine.output.outlock import LockedError
from shardsmith.errors import ShardsmithError, WorkerDied
from shardsmith.executors.base import UnitOutcome, unit_name

_ONE_AT_A_TIME = threading.Lock()


def run_remote(job: Job, unit: Unit, cwd: str) -> UnitOutcome:
    """``run_unit(job, unit)`` in ``cwd``; its result, or its first error line (the traceback of an
    unexpected one goes to this worker's log, where the engine keeps it)."""
    with _ONE_AT_A_TIME:
        start = time.monotonic()
        here = os.getcwd()
        try:
            os.chdir(cwd)
            result = run_unit(job, unit)
            return UnitOutcome(unit=unit, result=result, seconds=time.monotonic() - start)
        except WorkerDied as exc:  # a worker of the unit's own pool was killed: its finished work is kept
            return replace(_failed(unit, str(exc), exc.exit_code, start), lost=True)
        except LockedError as exc:  # the same unit, left running by a killed driver: the executor waits for it
            busy = exc.same_unit or isinstance(unit, PrepareUnit)  # prepare needs the whole output
            return replace(_failed(unit, str(exc), exc.exit_code, start), busy=busy)
        except ShardsmithError as exc:
            return _failed(unit, str(exc), exc.exit_code, start)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            return _failed(unit, f"{where}{exc.strerror or exc}", 1, start)
        except Exception as exc:
            print(f"shardsmith: {unit_name(unit)}: unexpected error", file=sys.stderr)
            traceback.print_exc()
            return _failed(unit, f"{type(exc).__name__}: {exc}".splitlines()[0], 1, start)
        finally:
            os.chdir(here)


def _failed(unit: Unit, line: str, code: int, start: float) -> UnitOutcome:
    return UnitOutcome(unit=unit, error=line.splitlines()[0] if line else "failed", exit_code=code,
                       seconds=time.monotonic() - start)

