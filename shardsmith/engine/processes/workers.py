"""Worker processes: a pool that starts fast, dies with its parent, and ends a run cleanly."""


from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_all_start_methods, get_context
from typing import Any

from shardsmith.engine.processes import interrupt
from shardsmith.errors import WorkerDied


@contextlib.contextmanager
def worker_pool(workers: int, *, initializer: Callable[..., None], initargs: tuple[Any, ...],
                advice: str) -> Iterator[ProcessPoolExecutor]:
    """Worker processes, forked where there is fork: they start in milliseconds and inherit the
    parent's imports and warmed state (a tokenizer; nothing is pickled). A worker the system kills
    breaks the pool, which ends the run with a message instead of a hang.

    The workers are forked at once, with Ctrl-C and SIGTERM held (``interrupt.held``): a signal
    raised in the main thread while ``os.fork`` runs its handlers (``logging``'s lock) is lost there
    with a traceback on stderr; held, it is raised once the workers exist, and ends the run in one line."""
    ctx = get_context("fork" if "fork" in get_all_start_methods() else "spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=initializer, initargs=initargs)
    try:
        with interrupt.held():
            pool.submit(int)  # (forking the pool starts every worker: the first task does, for fork)
        yield pool
    except BrokenProcessPool:
        if interrupt.received() is not None:
            raise interrupt.Interrupted(interrupt.received()) from None
        raise WorkerDied(f"a worker process died (killed by the system: out of memory?); no dataset was "
                         f"written; {advice}: the same command resumes from the finished work") from None
    except BaseException:
        # interrupted, or another task failed: stop the workers now instead of waiting for their
        # tasks (a task finishes or leaves only a temporary file; reruns never trust those)
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                process.kill()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
