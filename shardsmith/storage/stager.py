"""The background stager: downloads a run's URL inputs while the run works on those already here.

Inputs are fetched in the order the tasks read them (input index order: tasks are planned file by
file), by a few threads, and never more than ``budget`` bytes beyond the input the readers reached
(``arrival.reached``): a reader that asks for a later file moves that point, so the file it waits
for is always next. The first download that fails stops the stager and is told to every reader
still waiting (``arrival.fail``), unless ``skip``: then it is left out and listed (``skipped``), for
runs that stage every input before they start (``wait``). A cluster stage's stager (``on_demand``)
fetches only what its rank reads: the inputs its readers ask for, then those of its tasks
(``arrival.expect``), into a folder of its own.

How the bytes of one object are fetched, retried and renamed into place is the caller's
(``remote._fetch``); this module only decides when.

Why these numbers. The budget is ``url_inputs.ahead(--memory, free disk)`` = ``max(1 MB,
min(--memory, free disk / 2))``: ``--memory`` because what was just written is still in the page
cache when a worker reads it (the readers read from memory, not disk) and a task is at most an
eighth of ``--memory`` (``Sizing.chunk_bytes``), so several tasks' inputs are always ready; half the
free disk so that a ``--limit`` run on a full disk stops early. The point the readers reached is one
int64 in an anonymous shared mapping made before the workers fork (``arrival.reach``). At most
``THREADS`` (8) downloads run at once, and beyond the first no more than ``IN_FLIGHT`` (64 MB) of
objects: many small objects come in parallel (latency-bound), large ones one or two at a time so
that the first arrives early (against moto, one stream reads 75 MB/s and four 225 MB/s). A failure
reaches the readers through a file (``inputs.etags/.failed``) and the run ends with it (exit 1).

Who waits, and for what: a worker at the start of each task, the planner, pack-tokens' tokenizer
sample, the copy mode (which reads in shuffled order, so it waits for all). What must be read
before any work is the source's: ``Reader.reads_to_check`` (Parquet's column check and the events
sources' schema read every file; JSONL and image folders read none) and ``Reader.reads_to_plan`` (a
plain JSONL file bigger than one task is read to count lines at its cuts; compressed and small ones
are not; Parquet reads its footer; image folders plan from the listing). When the source plans each
file on its own (``Reader.plans_each_file``), the tasks are planned file by file as the files arrive
(``plan.Planned``), and ``run_scatter`` takes tasks as they come and checks results in input order
as they finish; ``--limit N`` plans and stages only as far as it reads (plus the budget). While
tasks are still arriving they run in worker processes even with ``--workers 1``: the downloads are
threads of the main process, and sharing its interpreter lock with the work made a one-worker run
slower than staging first (``bench/s3_inputs.py --only overlap``, bench/README.md). Staging needs
local disk for the inputs, checked first except with ``--limit`` and in cluster stages.

Cluster stages (``on_demand``): every rank lists the same objects (the same identities, plan and
fingerprint) but stages into a folder of its own in the shared scratch folder
(``.OUT.shardsmith-work/rank-R/inputs/``, with its own ``inputs.etags/``), so ranks never replace a
file another reads and no locks are needed on a cluster file system. It fetches the inputs a reader
of this rank asks for (``arrival.wait_whole`` marks them in a shared byte per input), then the inputs
of the rank's own scatter tasks (``arrival.expect``, from ``run.convert_units``), and nothing else:
gather and finalize ranks download nothing (but a check or schema that reads every file, Parquet's
and the events sources', downloads every file on each rank that runs it). The work done once per run
(the plan, pack-tokens' engine check or trained tokenizer, the events schema of a source whose reader
can take it back: ``Reader.schema_memo`` / ``recall_schema``, ROOT's) downloads what it reads on the
rank that does it. ``tests/test_s3_stages.py``: scatter rank 1 of 3 stages exactly its two files, and
the shards equal a one-process local run's.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path
from typing import Any

from shardsmith.errors import DataError
from shardsmith.storage import arrival

THREADS = 8  # downloads at once, at most
# bytes of downloads under way beyond the first: enough streams to fill a link where one stream is slow
# (moto here: 75 MB/s for one, 225 MB/s for four), few enough that the first object arrives early
IN_FLIGHT = 64 << 20


class Stager:
    """Downloads ``todo`` (objects with ``url``, ``size`` and ``index``: the input they become, in
    order) with ``fetch(object, stop) -> bytes written``."""

    def __init__(self, *, todo: Sequence[Any], fetch: Callable[[Any, threading.Event], int], budget: int,
                 failure: Path, skip: bool = False, on_demand: bool = False,
                 progress: Callable[[int], None] | None = None) -> None:
        self.todo = sorted(todo, key=lambda o: o.index)
        self.fetch = fetch
        self.budget = max(1, budget)
        self.skip = skip
        self.on_demand = on_demand
        self.progress = progress
        self.skipped: list[dict[str, str]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._slots = threading.Semaphore(THREADS)
        self._flying = 0  # bytes of the downloads under way
        self._lock = threading.Lock()
        self._indexes = [o.index for o in self.todo]
        self._before = [0, *accumulate(o.size for o in self.todo)]  # bytes of ``todo`` before each position
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(THREADS, len(self.todo))),
                                        thread_name_prefix="shardsmith-stage")
        self._thread = threading.Thread(target=self._run, name="shardsmith-stager", daemon=True)
        arrival.begin(failure, count=1 + max(self._indexes, default=-1))

    def start(self) -> Stager:
        self._thread.start()
        return self

    def wait(self) -> None:
        """Until every download is done (or the first failure, raised here unless ``skip``)."""
        arrival.reach(self._indexes[-1] if self._indexes else -1)
        while not self._done.wait(0.1):
            pass
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop downloading (the run ended): downloads under way stop at their next block and leave
        only temporary files."""
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- the scheduling thread ------------------------------------------------------------------

    def _ahead(self, position: int) -> int:
        """Bytes to download before ``todo[position]`` beyond the input the readers reached."""
        return self._before[position] - self._before[bisect_right(self._indexes, arrival.reached())]

    def _next(self) -> Iterator[Any]:
        """The objects in the order they are started: input order, within the budget ahead of the
        readers; on demand, what a reader asked for first, then the inputs of this rank's tasks."""
        if not self.on_demand:
            for position, o in enumerate(self.todo):
                while not self._stop.is_set() and o.index > arrival.reached() and self._ahead(position) >= self.budget:
                    self._stop.wait(0.02)
                yield o
            return
        left = {o.index: o for o in self.todo}
        while left and not self._stop.is_set():
            asked = [i for i in left if arrival.wanted(i)]
            index = min(asked) if asked else next((i for i in arrival.expected() if i in left), None)
            if index is None:
                self._stop.wait(0.02)
            else:
                yield left.pop(index)

    def _run(self) -> None:
        running: list[Future[int]] = []
        try:
            for o in self._next():
                while not self._stop.is_set() and not self._slots.acquire(timeout=0.1):
                    pass
                while not self._stop.is_set() and self._flying > 0 and self._flying + o.size > IN_FLIGHT:
                    self._stop.wait(0.01)
                if self._stop.is_set():
                    break
                with self._lock:
                    self._flying += o.size
                future = self._pool.submit(self._one, o)
                running.append(future)
            for future in running:
                future.result()
        finally:
            self._done.set()

    def _one(self, o: Any) -> int:
        try:
            if self._stop.is_set():
                return 0
            size = self.fetch(o, self._stop)
            if self.progress is not None:
                self.progress(size)
            return size
        except DataError as exc:
            if self.skip:
                self.skipped.append({"url": o.url, "reason": exc.reason})
            else:
                self._failed(exc, o.url, exc.reason)
            return 0
        except BaseException as exc:  # noqa: BLE001  (a bug or an odd client error: still one line to the readers)
            self._failed(exc, o.url, f"cannot stage it: {type(exc).__name__}: {exc}")
            return 0
        finally:
            with self._lock:
                self._flying -= o.size
            self._slots.release()

    def _failed(self, exc: BaseException, url: str, reason: str) -> None:
        if self._stop.is_set():
            return  # the run is ending: a download cut short is no failure
        if self.error is None:
            self.error = exc
            arrival.fail(url, reason)
        self._stop.set()
