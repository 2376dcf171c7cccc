"""Fault injection points for the crash, stall and race tests (environment variables only)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

GATED_STALL_SECONDS = 600.0  # a gated stall's cap: long past any test, so a test never races it


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: ``SHARDSMITH_CRASH_AT=name`` kills this process here
    with SIGKILL, as the out-of-memory killer or a preempted node would (no cleanup runs).
    ``SHARDSMITH_STALL_AT=name`` waits here instead, after creating the file ``SHARDSMITH_STALL_MARK``
    if set: a run caught in the middle, for the tests of concurrent runs, interruptions and inputs
    that change.

    How long it waits: with ``SHARDSMITH_STALL_UNTIL=FILE``, until that file exists (the test says
    when it is done with the run held there, so no test depends on how fast a loaded machine runs
    the other processes; ``SHARDSMITH_STALL_SECONDS``, default 600, caps it); without, for
    ``SHARDSMITH_STALL_SECONDS`` (default 30)."""
    if os.environ.get("SHARDSMITH_STALL_AT") == name:
        mark = os.environ.get("SHARDSMITH_STALL_MARK")
        if mark:
            Path(mark).touch()
        gate = os.environ.get("SHARDSMITH_STALL_UNTIL")
        if gate:
            _wait_for_file(Path(gate), float(os.environ.get("SHARDSMITH_STALL_SECONDS", GATED_STALL_SECONDS)))
        else:
            time.sleep(float(os.environ.get("SHARDSMITH_STALL_SECONDS", "30")))
    if os.environ.get("SHARDSMITH_CRASH_AT") == name:
        if os.environ.get("SHARDSMITH_CRASH_PARENT") and os.getppid() > 1:
            os.kill(os.getppid(), signal.SIGKILL)  # a worker takes the whole run down
        os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_file(gate: Path, cap: float) -> None:
    """Sleep in short steps until ``gate`` exists or ``cap`` seconds have passed (signals still arrive
    between the steps, as in the plain stall's sleep)."""
    deadline = time.monotonic() + cap
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
