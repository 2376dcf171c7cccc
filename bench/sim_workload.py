"""The synthetic run that ``sim_exchange.py`` simulates: pack-tokens on the JSONL of ``corpus.py`` at
the default options, as the engine's own sizing rules cut it (tasks, buckets, the gather's group
budget), and the documents of each task (record numbers and token lengths, no text, no payload).

Sizes and documents come from measurements, not from choices made here: a document is 2,549 B of
JSONL and its part file holds 0.4575 B per byte of JSONL (token ids and 24 B of key, order and
length: bench/README.md, "Executors", the counting pass at 1 GB); a document's length follows
``corpus.py``'s draw (words ~ lognormal(log 300, 0.8) clipped to 40..1,500), scaled to those two
means. The corpus is one 10 GB file a node ("100 nodes x 10 GB each"), smaller corpora one file.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from shardsmith.core.input_file import InputFile
from shardsmith.engine.shuffle.buckets import bucket_count
from shardsmith.engine.shuffle.run import Sizing
from shardsmith.kit.reader import Task

JSONL_BYTES_PER_DOC = 2549  # measured: corpus.py's documents (bench/README.md, "Executors")
PART_BYTES_PER_JSONL_BYTE = 0.4575  # measured: 457.5 MB of part files for 1 GB of JSONL (same run)
HEAD_BYTES = 24  # a document's key, input order and length in a part file (shuffle.PartWriter)
TOKEN_BYTES = 2  # uint16 ids: the 32,000-id BPE of make_tokenizers.py
TOKENS_PER_DOC = (PART_BYTES_PER_JSONL_BYTE * JSONL_BYTES_PER_DOC - HEAD_BYTES) / TOKEN_BYTES  # 571.1
FILE_BYTES = 10 * 10**9  # one input file a node
WORDS = (math.log(300), 0.8, 40, 1500)  # corpus.py: a document's words, lognormal(mu, sigma) clipped


def _mean_words() -> float:
    """The mean of corpus.py's clipped word count (a fixed sample: the same every run)."""
    mu, sigma, lo, hi = WORDS
    return float(np.clip(np.random.default_rng(0).lognormal(mu, sigma, 4_000_000), lo, hi).mean())


MEAN_WORDS = _mean_words()


def gib(n: float) -> str:
    """A byte count as people say it: 10 GB, 1 TB (powers of ten, as input sizes are given)."""
    for unit, scale in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One simulated run: ``input_bytes`` of JSONL on ``ranks`` ranks with pack-tokens' options."""

    input_bytes: int
    ranks: int
    memory: int = 1_000_000_000  # --memory's default
    workers: int = 1  # an executor's unit runs one worker unless --workers says
    seed: int = 0
    shard_tokens: int = 1_000_000_000  # pack-tokens --shard-tokens's default
    splits: tuple[tuple[str, float], ...] = (("train", 1.0),)  # --split's default

    @property
    def name(self) -> str:
        return f"{gib(self.input_bytes)} / {self.ranks:,} rank{'s' if self.ranks > 1 else ''}"

    @property
    def identity(self) -> dict[str, str]:
        """The run's identity as the scratch folder's stamp holds it (``engine/output/resume.run_identity``:
        the command, and digests of its options and of its inputs; the same length as a real one)."""
        def digest(value: object) -> str:
            return hashlib.sha256(repr(value).encode()).hexdigest()[:32]

        return {"command": "pack-tokens", "options": digest((self.memory, self.workers, self.seed, self.shard_tokens,
                                                              self.splits)),
                "inputs": digest((self.input_bytes, FILE_BYTES))}

    @cached_property
    def sizing(self) -> Sizing:
        """The engine's own rule (``engine/shuffle/run.Sizing``) for the task size, group size and spill."""
        return Sizing.of(memory=self.memory, workers=self.workers, input_bytes=self.input_bytes, world=self.ranks)

    @property
    def buckets(self) -> int:
        """``buckets.bucket_count`` of what pack-tokens estimates (``JobSteps.estimated_bytes``: the input)."""
        return bucket_count(self.input_bytes, self.sizing.group_bytes)

    @property
    def group_budget(self) -> int:
        """The gather's bucket-group budget of a cluster unit (``engine/shuffle/run.Sizing.group_budget``)."""
        return self.sizing.group_budget(workers=self.workers, world=self.ranks)

    @cached_property
    def files(self) -> list[InputFile]:
        n = max(1, -(-self.input_bytes // FILE_BYTES))
        sizes = [self.input_bytes // n + (1 if i < self.input_bytes % n else 0) for i in range(n)]
        return [InputFile(path=f"/corpus/node-{i:05d}.jsonl", rel=f"node-{i:05d}.jsonl", index=i, size=s)
                for i, s in enumerate(sizes)]

    def tasks_in(self, f: InputFile) -> int:
        """Tasks of one file: the JSONL planner cuts it every ``chunk_bytes`` (at the next line end)."""
        return max(1, -(-f.size // self.sizing.chunk_bytes))

    @property
    def task_count(self) -> int:
        return sum(self.tasks_in(f) for f in self.files)

    def file_tasks(self, f: InputFile, first_index: int = 0, *, limit: int | None = None) -> list[Task]:
        """The (first ``limit``) tasks of one file, numbered from ``first_index``, each with its first
        record number."""
        chunk, tasks, first = self.sizing.chunk_bytes, [], 0
        for k in range(min(self.tasks_in(f), limit or self.tasks_in(f))):
            start, stop = k * chunk, min(f.size, (k + 1) * chunk)
            tasks.append(Task(index=first_index + k, file=f, start=start, stop=stop, first_record=first,
                              nbytes=stop - start))
            first += len(self._words(f, k, stop - start))
        return tasks

    @cached_property
    def tasks(self) -> list[Task]:
        """Every task of the run, in input order (what ``reader.plan`` gives the engine)."""
        out: list[Task] = []
        for f in self.files:
            out += self.file_tasks(f, len(out))
        return out

    def _words(self, f: InputFile, k: int, nbytes: int) -> np.ndarray:
        """Words of the documents whose lines start in the ``k``-th task of file ``f``."""
        mu, sigma, lo, hi = WORDS
        rng = np.random.default_rng([self.seed, f.index, k])
        per_word = JSONL_BYTES_PER_DOC / MEAN_WORDS
        draw = max(16, int(nbytes / JSONL_BYTES_PER_DOC * 1.3) + 64)
        words = np.clip(rng.lognormal(mu, sigma, draw), lo, hi)
        starts = np.cumsum(words * per_word) - words * per_word
        n = int(np.searchsorted(starts, nbytes, side="left"))
        assert n < draw, "draw more documents"
        return words[:n]

    def documents(self, task: Task) -> tuple[np.ndarray, np.ndarray]:
        """A task's documents: record numbers (in its file) and payload bytes (token ids)."""
        k = task.start // self.sizing.chunk_bytes
        words = self._words(task.file, k, task.nbytes)
        tokens = np.maximum(1, np.rint(words * (TOKENS_PER_DOC / MEAN_WORDS))).astype(np.int64)
        records = task.first_record + np.arange(len(words), dtype=np.int64)
        return records, tokens * TOKEN_BYTES

    def scatter_meta(self, task: Task) -> dict[str, Any] | None:
        """What a real scatter recorded of ``task`` beyond its documents (its part's footer
        ``meta``), or None: a synthetic task, whose meta the exchange makes as its scatter would."""
        return None


@dataclass(frozen=True, kw_only=True)
class RecordedWorkload(Workload):
    """The documents of a real run's scatter, read back from its part files (``sim_check.py``): the
    simulation then writes the same parts, less the payload, and its units can be compared with
    the real run's. ``tasks`` are the run's own (its staged plan), ``docs`` per task its documents'
    record numbers and payload bytes, ``metas`` each part's footer ``meta``."""

    recorded_identity: tuple[tuple[str, str], ...] = ()
    recorded_files: tuple[InputFile, ...] = ()
    recorded_tasks: tuple[Task, ...] = ()
    docs: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, compare=False)
    metas: dict[int, dict[str, Any]] = field(default_factory=dict, compare=False)

    @property
    def identity(self) -> dict[str, str]:
        return dict(self.recorded_identity)

    @property
    def name(self) -> str:
        return f"recorded {gib(self.input_bytes)} / {self.ranks:,} ranks"

    @cached_property
    def files(self) -> list[InputFile]:
        return list(self.recorded_files)

    @cached_property
    def tasks(self) -> list[Task]:
        return list(self.recorded_tasks)

    @property
    def task_count(self) -> int:
        return len(self.recorded_tasks)

    def file_tasks(self, f: InputFile, first_index: int = 0, *, limit: int | None = None) -> list[Task]:
        mine = [t for t in self.recorded_tasks if t.file.index == f.index]
        return mine[:limit] if limit is not None else mine

    def documents(self, task: Task) -> tuple[np.ndarray, np.ndarray]:
        return self.docs[task.index]

    def scatter_meta(self, task: Task) -> dict[str, Any] | None:
        return self.metas[task.index]
