"""Executors: where a job's units run (docs/design.md, "The flow"; how they share the work:
``executors/base.py``).

An executor takes a job (``engine/job.py``) and runs its units phase by phase (``engine/units.py``):
every scatter unit, then every gather unit, then finalize, each unit by ``remote.run_remote`` in
whatever process the engine gives it. An executor knows nothing of what a unit does, and the units
exchange nothing through it: part files and shards go through the output folder (or bucket), the
engine carries only the job, the unit and a small summary back. The bytes therefore depend on the
job alone, never on the executor or the number of ranks.

``local`` runs the job in this process (today's run); ``dask``, ``ray`` and ``slurm`` each need an
extra (``shardsmith[dask]`` ...), imported only when chosen.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"run": "choose", "executor_named": "choose", "LocalExecutor": "local", "DaskExecutor": "dask",
         "RayExecutor": "ray", "SlurmExecutor": "slurm"}


def __getattr__(name: str) -> Any:  # each engine's module (and its package) imported only when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"shardsmith.executors.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'shardsmith.executors' has no attribute {name!r}")


__all__ = sorted(_LAZY)
