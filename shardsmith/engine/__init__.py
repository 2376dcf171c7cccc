"""The engine: a job (what to run) run unit by unit (scatter, plan, gather, finalize, or the copy
of unchanged files) into an output folder or prefix, resumable after a kill.

Its public face is what a command needs to describe its job and an executor to run its units:
``Job``, ``JobSteps`` (with ``JobRun``, ``Described``, ``Converted``, ``ConvertingOptions``),
``run_job`` and ``run_unit``, and the units (``Unit``, ``phases``, ...). The names are imported when
first asked for (PEP 562): every process of the command line imports this package
(``processes.interrupt``), and ``shardsmith --help`` imports neither numpy nor the shuffle.

The layout, bottom first; a subpackage imports those before it, never one after it
(``tests/test_layout.py``):

- ``processes/``: signals, worker pools that die with their parent, answers from a forked child;
- ``output/``: the output folder or prefix, its lock or lease, its claim, the run's identity, the session;
- ``inputs/``: input files found and identified, URLs listed and staged, the tasks planned once;
- ``shuffle/``: the scatter into part files, the plan, the gather into shards, the spill given back;
- ``copying/``: the copy mode, whole files into shards planned from the listing alone;
- this folder: the job (``job``, ``units``, ``options``, ``choose``) and the run of it (``conduct``,
  ``output_for``, ``finish``); ``options`` and ``units`` are plain values any subpackage may import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardsmith.engine.conduct import run_job, run_unit
    from shardsmith.engine.job import Described, Job, JobRun, JobSteps
    from shardsmith.engine.options import ConvertingOptions
    from shardsmith.engine.shuffle.run import Converted
    from shardsmith.engine.units import (
        FinalizeUnit,
        GatherUnit,
        PlanUnit,
        PrepareUnit,
        ScatterUnit,
        Unit,
        phases,
    )

# each public name and the module that defines it
_FACE = {
    "Job": "job", "JobSteps": "job", "JobRun": "job", "Described": "job",
    "run_job": "conduct", "run_unit": "conduct",
    "ConvertingOptions": "options", "Converted": "shuffle.run",
    "Unit": "units", "PrepareUnit": "units", "ScatterUnit": "units", "PlanUnit": "units", "GatherUnit": "units",
    "FinalizeUnit": "units", "phases": "units",
}

__all__ = ["Converted", "ConvertingOptions", "Described", "FinalizeUnit", "GatherUnit", "Job", "JobRun", "JobSteps",
           "PlanUnit", "PrepareUnit", "ScatterUnit", "Unit", "phases", "run_job", "run_unit"]


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:  # (a submodule not imported yet: the import system imports it next)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
