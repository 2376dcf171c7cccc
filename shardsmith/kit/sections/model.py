"""What a report is made of: sections of tables, figures and notes, and the sampling bounds every
section respects (a 10 GB input is looked at in under a minute, in bounded memory)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsmith.core.words import plural


@dataclass(frozen=True, kw_only=True)
class Table:
    """Numbers as text: every figure's numbers also appear in a table."""

    caption: str
    header: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    note: str = ""  # e.g. "the 200 largest of 1,000 rows"


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One PNG: ``name`` is its file name beside the HTML (never made from data)."""

    name: str
    title: str
    png: bytes


@dataclass(kw_only=True)
class Section:
    title: str
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


@dataclass(kw_only=True)
class Sampling:
    """How much a report reads: a seeded sample of shards, files and records, and a deadline.

    ``max_samples`` samples (events, images, rows) at most; ``max_tokens`` tokens for the token
    counts; ``max_files`` raw input files and ``max_tasks`` byte ranges (``Reader.plan``) of
    them, at most ``records_per_task`` records each; reading stops at ``seconds``."""

    seed: int = 0
    seq_len: int | None = None  # tokens: documents longer than this are cut (None: the manifest's, or 1024)
    fields: tuple[str, ...] | None = None  # events: the fields to draw (None: every one, up to the panel limit)
    max_samples: int = 20_000
    max_documents: int = 5_000_000
    max_tokens: int = 2_000_000
    max_files: int = 64
    max_tasks: int = 32
    records_per_task: int = 1_000
    seconds: float = 30.0
    started: float = field(default_factory=time.monotonic)

    def rng(self, salt: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, salt])

    def pick(self, n: int, k: int, *, salt: int = 0) -> np.ndarray:
        """``min(n, k)`` of ``range(n)``, seeded, in increasing order (all of them when n <= k)."""
        if n <= k:
            return np.arange(n, dtype=np.int64)
        return np.sort(self.rng(salt).choice(n, size=k, replace=False)).astype(np.int64)

    def late(self) -> bool:
        return time.monotonic() - self.started > self.seconds

    def said(self, taken: int, of: int, unit: str) -> str:
        """A note of the share read: "all 1,200 samples" or "a seeded sample of 20,000 of 3,000,000 samples (0.7%)"."""
        counted = plural(of, unit.removesuffix("s"))  # (the callers name the unit in the plural)
        if taken >= of:
            return f"all {counted}"
        return f"a seeded sample (seed {self.seed}) of {taken:,} of {counted} ({100 * taken / max(of, 1):.2g}%)"


def summary_row(name: str, values: np.ndarray, unit: str = "") -> tuple[Any, ...]:
    """count, min, median, mean, max of a sample, as a table row."""
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        return (name, 0, "", "", "", "", unit)
    return (name, len(v), _num(v.min()), _num(np.median(v)), _num(v.mean()), _num(v.max()), unit)


SUMMARY_HEADER = ("what", "count", "min", "median", "mean", "max", "unit")


def _num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.4g}"
