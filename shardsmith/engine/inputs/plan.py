"""Work a staged run does once: what a command computes from its inputs before the scatter (the
task plan, the tokenizer engine check), kept in the scratch folder beside the output.

Every rank of every stage runs the same command. Without this, each would read the whole input
to plan its tasks (the JSONL planner counts lines to number records), and each gather and
finalize would repeat an engine check it has no use for. The first process to compute a value
writes it atomically; the value is a pure function of the inputs and options, which the run
fingerprint in its name stands for, so ranks racing to write it write the same bytes.

Why it matters: a staged run on W ranks starts 2W+1 processes where a local run starts one, so what
a process does before its work is paid 2W+1 times. What is cached: the plan, the engine check, the
ROOT schema, what pack-tokens takes from its tokenizer (``commands/token_facts.py``); so a gather or
finalize of a ROOT run neither imports uproot nor opens an input, and only the process that checks
the tokenizer engine imports ``tokenizers`` (the scatter still checks every file it reads against
the schema).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import orjson

from shardsmith.core.file_listing import staged_only
from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.core.input_file import InputFile
from shardsmith.engine.output.outdir import work_path
from shardsmith.kit.reader import Reader, Task
from shardsmith.storage import arrival

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


def wait_to_check(reader: Reader, files: Sequence[InputFile]) -> None:
    """Wait for the inputs still being staged from a URL that ``check`` (or ``schema``) reads."""
    arrival.wait_whole([f for f in staged_only(files) if f.origin and reader.reads_to_check(f)])


def wait_to_plan(reader: Reader, files: list[InputFile], *, chunk_bytes: int) -> None:
    """Wait for the inputs still being staged from a URL that checking and planning read
    (``Reader.reads_to_plan``); the others arrive while the run works."""
    arrival.wait_whole([f for f in files if f.origin and reader.reads_to_plan(f, chunk_bytes=chunk_bytes)])


class Planned(Sequence[Task]):
    """The tasks of inputs still arriving from a URL, planned file by file as they are read: the
    first file's tasks are ready once that file is here (when planning reads it), while the stager
    fetches the next. The same tasks, in the same order, as ``reader.plan(files)``; asking for its
    length or an item plans the files up to there (and waits for them)."""

    def __init__(self, reader: Reader, files: list[InputFile], *, chunk_bytes: int) -> None:
        self.reader = reader
        self.chunk_bytes = chunk_bytes
        self.nbytes = sum(f.size for f in files)  # the tasks' bytes: exact for byte ranges, within a file's rounding else
        # about how many tasks the files make, known before any is planned (what the scatter starts
        # workers for), or None where a file must be here to know (``Reader.expected_tasks``)
        counts = [reader.expected_tasks(f, chunk_bytes=chunk_bytes) for f in files]
        self.expected = None if None in counts else sum(counts)  # type: ignore[arg-type]
        self._files = iter(files)
        self._tasks: list[Task] = []

    def _more(self) -> bool:
        f = next(self._files, None)
        if f is None:
            return False
        wait_to_plan(self.reader, [f], chunk_bytes=self.chunk_bytes)
        for t in self.reader.plan([f], chunk_bytes=self.chunk_bytes):
            self._tasks.append(Task(index=len(self._tasks), file=f, start=t.start, stop=t.stop,
                                    first_record=t.first_record, nbytes=t.nbytes, files=t.files))
        return True

    def __iter__(self) -> Iterator[Task]:
        i = 0
        while i < len(self._tasks) or self._more():
            if i < len(self._tasks):
                yield self._tasks[i]
                i += 1

    def __len__(self) -> int:
        while self._more():
            pass
        return len(self._tasks)

    @overload
    def __getitem__(self, i: int) -> Task: ...
    @overload
    def __getitem__(self, i: slice) -> list[Task]: ...
    def __getitem__(self, i: int | slice) -> Task | list[Task]:
        if isinstance(i, slice) or i < 0:
            len(self)
        while isinstance(i, int) and i >= len(self._tasks) and self._more():
            pass
        return self._tasks[i]


def task_bytes(tasks: Sequence[Task]) -> int:
    """The bytes of every task (a progress bar's total), without planning tasks not planned yet."""
    return tasks.nbytes if isinstance(tasks, Planned) else sum(t.nbytes for t in tasks)


def workers_for(tasks: Sequence[Task], workers: int) -> int:
    """Worker processes worth starting for ``tasks``: no more than there are tasks (for tasks still
    being planned, than they are expected to be, where that is known), and at least one."""
    if isinstance(tasks, Planned):
        return max(1, min(workers, tasks.expected or workers))
    return max(1, min(workers, len(tasks)))


def plan_tasks(reader: Reader, files: list[InputFile], *, chunk_bytes: int, stage: str | None, out: Path,
               run: dict[str, str]) -> Sequence[Task]:
    """``reader.plan``, once per staged run; file by file as they arrive (``Planned``) when inputs
    from a URL are still being staged and the reader plans each file on its own."""
    if stage is None and any(map(arrival.arriving, files)) and reader.plans_each_file:
        return Planned(reader, files, chunk_bytes=chunk_bytes)
    wait_to_plan(reader, files, chunk_bytes=chunk_bytes)
    by_index = {f.index: f for f in files}

    def dump(tasks: list[Task]) -> list[list[Any]]:
        return [[t.index, t.file.index, t.start, t.stop, t.first_record, t.nbytes, [f.index for f in t.files]]
                for t in tasks]

    def load(rows: list[list[Any]]) -> list[Task]:
        return [Task(index=i, file=by_index[f], start=a, stop=b, first_record=r, nbytes=n,
                     files=tuple(by_index[j] for j in fs)) for i, f, a, b, r, n, fs in rows]

    return cached("tasks", lambda: reader.plan(files, chunk_bytes=chunk_bytes), stage=stage, out=out, run=run,
                  dump=dump, load=load)
