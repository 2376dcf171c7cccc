"""Fault injection points for the crash, stall and race tests (environment variables only)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: ``SHARDSMITH_CRASH_AT=name`` kills this process here
    with SIGKILL, as the out-of-memory killer or a preempted node would (no cleanup runs).
    ``SHARDSMITH_STALL_AT=name`` waits here instead (``SHARDSMITH_STALL_SECONDS``, default 30),
    after creating the file ``SHARDSMITH_STALL_MARK`` if set: a run caught in the middle, for the
    tests of concurrent runs, interruptions and inputs that change."""
    if os.environ.get("SHARDSMITH_STALL_AT") == name:
        mark = os.environ.get("SHARDSMITH_STALL_MARK")
        if mark:
            Path(mark).touch()
        time.sleep(float(os.environ.get("SHARDSMITH_STALL_SECONDS", "30")))
    if os.environ.get("SHARDSMITH_CRASH_AT") == name:
        if os.environ.get("SHARDSMITH_CRASH_PARENT") and os.getppid() > 1:
            os.kill(os.getppid(), signal.SIGKILL)  # a worker takes the whole run down
        os.kill(os.getpid(), signal.SIGKILL)
