"""Work a staged run does once: what a command computes from its inputs before the scatter (the
task plan, the tokenizer engine check), kept in the scratch folder beside the output.

Every rank of every stage runs the same command. Without this, each would read the whole input
to plan its tasks (the JSONL planner counts lines to number records), and each gather and
finalize would repeat an engine check it has no use for. The first process to compute a value
writes it atomically; the value is a pure function of the inputs and options, which the run
fingerprint in its name stands for, so ranks racing to write it write the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.engine.inputs import InputFile
from shardsmith.engine.outdir import work_path
from shardsmith.sources.base import Reader, Task

T = TypeVar("T")


def cached(name: str, compute: Callable[[], T], *, stage: str | None, out: Path, run: dict[str, str],
           dump: Callable[[T], Any], load: Callable[[Any], T]) -> T:
    """``compute()``, or (in a staged run) the value an earlier process of the run saved."""
    if stage is None:
        return compute()
    path = work_path(out) / f"{name}-{run['options'][:12]}-{run['inputs'][:12]}.json"
    try:
        return load(orjson.loads(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass  # absent (or torn): compute it
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, orjson.dumps(dump(value)))
    return value


def plan_tasks(reader: Reader, files: list[InputFile], *, chunk_bytes: int, stage: str | None, out: Path,
               run: dict[str, str]) -> list[Task]:
    """``reader.plan``, once per staged run."""
    by_index = {f.index: f for f in files}

    def dump(tasks: list[Task]) -> list[list[Any]]:
        return [[t.index, t.file.index, t.start, t.stop, t.first_record, t.nbytes, [f.index for f in t.files]]
                for t in tasks]

    def load(rows: list[list[Any]]) -> list[Task]:
        return [Task(index=i, file=by_index[f], start=a, stop=b, first_record=r, nbytes=n,
                     files=tuple(by_index[j] for j in fs)) for i, f, a, b, r, n, fs in rows]

    return cached("tasks", lambda: reader.plan(files, chunk_bytes=chunk_bytes), stage=stage, out=out, run=run,
                  dump=dump, load=load)
