"""``--executor local`` (the default): every unit in this process and its worker processes, the
scatter's results handed to the gather in memory (``engine.conduct.run_job``)."""

from __future__ import annotations

from typing import Any

from shardsmith.engine import Job, run_job
from shardsmith.errors import UsageError


class LocalExecutor:
    """The job here, as ``shardsmith convert`` has always run it (``--workers`` processes)."""

    name = "local"

    def __init__(self, *, ranks: int | None = None) -> None:
        if ranks is not None:
            raise UsageError("--ranks applies to --executor ray, dask or slurm; a local run uses --workers")

    def run(self, job: Job) -> dict[str, Any]:
        return run_job(job)
