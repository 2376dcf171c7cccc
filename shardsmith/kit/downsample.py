"""``--balance``: seeded hash downsampling of majority classes at conversion time, in one place.

``--balance max=N`` keeps at most N samples of each class, ``--balance ratio=R`` at most R times
the smallest class's count (``,label=FIELD`` names the events' integer label field; an image
folder's class is its folder). Which samples of a class are kept: the N with the smallest
**balance hash**, a 64-bit hash of (seed, sample identity: input path and record number), so the
kept set is a pure function of the seed and the inputs -- the same for any ``--workers``, task
plan or order, and a larger N keeps a superset. The plan is made before the run from every
sample's class and hash (image folders: the listing; events: one pass over the label field), and
applied where the samples are made: image files left out of the listing (their bytes are never
read), events left out of their chunk in the worker (``keep``). The manifest's ``balance`` records
the spec, the seed, each class's count before and after, and the samples dropped.

Details. Image folders: the dropped files leave the list before anything reads them (the others
keep their indexes: the writers' source list is the whole listing), and the direct and shuffled
paths agree. Events: one pass in the main process reads the label field with a reader of that field
alone (the run's reader with ``--group-by``); ``EventProcessor`` drops the other events of each chunk
in the worker and reports them as ``Processed.dropped``, which the task's part file keeps
(``dropped``) and ``Tally`` subtracts: nothing is lost silently. JSONL and Parquet rows are refused
(no class). Off by default: no byte of an unbalanced run changes. Limits: the counts are over the
whole input, before ``--split`` (every split is thinned alike); ``--limit`` applies after it; with
``--stage`` every rank that plans reads the events' labels (the staged bytes and manifest equal a
one-machine run's: ``tests/test_balance_convert.py``); with URL inputs the stager may still download
images the plan leaves out. The closing line ends with "N samples dropped by --balance RULE" (a
scatter rank's with the events its tasks dropped); the manifest's ``balance.dropped`` holds N.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsmith.core.input_file import InputFile
from shardsmith.errors import UsageError
from shardsmith.kit.keys import record_keys

USAGE = "--balance max=N or ratio=R, optionally with ,label=FIELD (events), e.g. --balance max=1000,label=y"


@dataclass(frozen=True)
class BalanceSpec:
    """What ``--balance`` asked for: a cap per class (``max``) or relative to the smallest (``ratio``)."""

    cap: int | None = None
    ratio: float | None = None
    label: str | None = None

    @classmethod
    def parse(cls, text: str) -> BalanceSpec:
        parts = dict(p.partition("=")[::2] for p in (s.strip() for s in text.split(",")) if p)
        unknown = set(parts) - {"max", "ratio", "label"}
        if unknown or ("max" in parts) == ("ratio" in parts) or any(not v for v in parts.values()):
            raise UsageError(f"--balance {text!r}: give {USAGE}")
        try:
            cap = int(parts["max"]) if "max" in parts else None
            ratio = float(parts["ratio"]) if "ratio" in parts else None
        except ValueError:
            raise UsageError(f"--balance {text!r}: N must be a whole number and R a number") from None
        if (cap is not None and cap < 1) or (ratio is not None and not (math.isfinite(ratio) and ratio >= 1)):
            raise UsageError(f"--balance {text!r}: N must be >= 1 and R >= 1")
        return cls(cap=cap, ratio=ratio, label=parts.get("label"))

    def limit(self, counts: Iterable[int]) -> int:
        """The most samples any class keeps, given every class's count."""
        if self.cap is not None:
            return self.cap
        present = [c for c in counts if c > 0]
        return math.ceil((self.ratio or 1.0) * min(present)) if present else 0

    def describe(self) -> dict[str, Any]:
        rule = {"max": self.cap} if self.cap is not None else {"ratio": self.ratio}
        return {**rule, **({"label": self.label} if self.label else {})}


def balance_hashes(seed: int, paths: str | list[str], records: np.ndarray) -> np.ndarray:
    """The balance hash of each sample (its path, or one path per record, and its record number)."""
    return record_keys(f"balance:{int(seed)}", paths, records)


@dataclass
class BalancePlan:
    """Per class, the largest balance hash kept (classes absent keep everything)."""

    spec: BalanceSpec
    seed: int
    before: dict[str, int]
    after: dict[str, int]
    thresholds: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: BalanceSpec, seed: int, classes: np.ndarray, hashes: np.ndarray) -> BalancePlan:
        """From every sample's class (any hashable values) and balance hash."""
        names, inverse = np.unique(np.asarray(classes), return_inverse=True)
        counts = np.bincount(inverse, minlength=len(names))
        limit = spec.limit(counts.tolist())
        plan = cls(spec=spec, seed=seed, before={}, after={})
        for c, name in enumerate(names.tolist()):
            key, n = str(name), int(counts[c])
            plan.before[key], plan.after[key] = n, min(n, limit)
            if n > limit:
                plan.thresholds[key] = int(np.partition(hashes[inverse == c], limit - 1)[limit - 1])
        return plan

    def keep(self, classes: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Which of these samples the plan keeps (bool mask)."""
        mask = np.ones(len(hashes), bool)
        if not self.thresholds:
            return mask
        values = np.asarray(classes)
        for name in np.unique(values).tolist():
            limit = self.thresholds.get(str(name))
            if limit is not None:
                at = values == name
                mask[at] = hashes[at] <= np.uint64(limit)
        return mask

    @property
    def dropped(self) -> int:
        """Samples the plan leaves out, over every class."""
        return sum(self.before.values()) - sum(self.after.values())

    def describe(self) -> dict[str, Any]:
        return {**self.spec.describe(), "seed": self.seed, "before": self.before, "after": self.after,
                "dropped": self.dropped}


def balance_files(files: list[InputFile], spec: BalanceSpec, *, seed: int) -> tuple[list[InputFile], BalancePlan]:
    """Image folders (one sample per file, class = folder): the files kept, in input order, with their
    indexes in the whole listing (what the writers' source list and the stager number)."""
    if spec.label is not None:
        raise UsageError("--balance ...,label=FIELD is for events; an image folder's class is its folder")
    hashes = balance_hashes(seed, [f.rel for f in files], np.zeros(len(files), np.int64))
    classes = np.array([f.group for f in files], dtype=object)
    plan = BalancePlan.of(spec, seed, classes, hashes)
    kept = plan.keep(classes, hashes)
    return [f for f, k in zip(files, kept.tolist()) if k], plan


def balance_events(spec: BalanceSpec, reader: Any, files: list[InputFile], schema: Any, *, seed: int,
                   chunk_bytes: int) -> BalancePlan:
    """Events (class = the integer scalar field ``label``): one pass over the inputs reading every
    event's label, in this process, before the run."""
    from shardsmith.errors import DataError
    from shardsmith.kit.reader import StreamError

    spec_field = next((f for f in schema.fields if f.name == spec.label), None)
    if spec.label is None or spec_field is None or spec_field.ragged or spec_field.shape \
            or spec_field.np_dtype.kind not in "iu":
        raise UsageError(f"--balance on events needs ,label=FIELD naming an integer field with one value per event "
                         f"(got {spec.label!r}; fields: {', '.join(f.name for f in schema.fixed)[:200]})")
    classes: list[np.ndarray] = []
    hashes: list[np.ndarray] = []
    for task in reader.plan(files, chunk_bytes=chunk_bytes):
        for chunk in reader.read(task):
            if isinstance(chunk, StreamError):
                raise DataError(file=task.file.rel, reason=f"{chunk.reason} (while reading --balance labels)")
            records = np.arange(chunk.first, chunk.first + chunk.n, dtype=np.int64)
            classes.append(np.asarray(chunk.columns[spec.label]).reshape(-1).astype(np.int64))
            hashes.append(balance_hashes(seed, task.file.rel, records))
    return BalancePlan.of(spec, seed, np.concatenate(classes) if classes else np.zeros(0, np.int64),
                          np.concatenate(hashes) if hashes else np.zeros(0, np.uint64))
