"""An executor by its ``--executor`` name, with only the options it takes (one line for any other)."""

from __future__ import annotations

import importlib
from typing import Any

from shardsmith.engine import Job
from shardsmith.errors import UsageError
from shardsmith.executors.base import Executor

# name -> (module, class, the options it takes besides --ranks)
EXECUTORS: dict[str, tuple[str, str, frozenset[str]]] = {
    "local": ("shardsmith.executors.local", "LocalExecutor", frozenset()),
    "dask": ("shardsmith.executors.dask", "DaskExecutor", frozenset({"address"})),
    "ray": ("shardsmith.executors.ray", "RayExecutor", frozenset({"address"})),
    "slurm": ("shardsmith.executors.slurm", "SlurmExecutor", frozenset({"wait", "slurm_args"})),
}
_FLAGS = {"address": "--address", "wait": "--no-wait", "slurm_args": "--slurm-arg"}
_UNSET = {"address": None, "wait": True, "slurm_args": ()}


def executor_named(name: str, *, ranks: int | None = None, **options: Any) -> Executor:
    """``--executor NAME`` with its options; an option it does not take, given, is refused."""
    if name not in EXECUTORS:
        raise UsageError(f"--executor {name!r}: choose one of {', '.join(EXECUTORS)}")
    module, cls, takes = EXECUTORS[name]
    for key, value in options.items():
        if key not in takes and value != _UNSET.get(key):
            users = [n for n, (_, _, t) in EXECUTORS.items() if key in t]
            raise UsageError(f"{_FLAGS.get(key, key)} applies to --executor {' or '.join(users)}, not to {name}")
    kwargs = {k: v for k, v in options.items() if k in takes}
    executor: Executor = getattr(importlib.import_module(module), cls)(ranks=ranks, **kwargs)
    return executor


def run(job: Job, *, executor: Executor | str = "local", **options: Any) -> dict[str, Any]:
    """Run ``job`` (``shardsmith.commands.convert.job_of`` and the like) on ``executor``: an executor
    object (``DaskExecutor(client=...)``) or its name with its options; returns the manifest."""
    chosen = executor_named(executor, **options) if isinstance(executor, str) else executor
    return chosen.run(job)
