"""What the report of a dataset reads: per split, a seeded choice of its samples (``picked``), read
``BLOCK`` at a time through a dataset's ``get_batch`` (``sampled_batches``) until the deadline, and
the notes that say what was read (``sampled_note``, ``events_note``). Shared by the formats'
report sections (``formats/<name>/report.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.words import plural
from shardsmith.kit.sections.model import Sampling

BLOCK = 4096  # events a batch reads


def picked(manifest: dict[str, Any], sampling: Sampling, *, cap: int) -> dict[str, tuple[int, np.ndarray]]:
    """Per split with samples: its size and the seeded indices read (at most ``cap`` over all splits)."""
    splits = {name: s["samples"] for name, s in manifest["splits"].items() if s["samples"]}
    per = max(1, cap // max(len(splits), 1))
    return {name: (n, sampling.pick(n, per, salt=k)) for k, (name, n) in enumerate(splits.items())}


def sampled_note(chosen: dict[str, tuple[int, np.ndarray]], sampling: Sampling, unit: str) -> str:
    taken = sum(len(i) for _, i in chosen.values())
    return "Read: " + sampling.said(taken, sum(n for n, _ in chosen.values()), unit) + "."


def sampled_batches(dataset: Any, out: Path, chosen: dict[str, tuple[int, np.ndarray]], sampling: Sampling
                    ) -> Iterator[tuple[Any, Any]]:
    """(dataset, batch) for each chosen split's sampled events, ``BLOCK`` at a time through
    ``dataset(out, split=)``'s ``get_batch``, until the report's deadline."""
    for split, (_, idx) in chosen.items():
        ds = dataset(out, split=split)
        try:
            for a in range(0, len(idx), BLOCK):
                if sampling.late():
                    break
                yield ds, ds.get_batch(idx[a:a + BLOCK])
        finally:
            close = getattr(ds, "close", None)
            if close is not None:
                close()


def events_note(chosen: dict[str, tuple[int, np.ndarray]], sampling: Sampling, events: int, unit: str) -> str:
    """What an events section read: the share of the ``unit``s (events or samples), the events in them."""
    read = sum(len(i) for _, i in chosen.values())
    late = " Stopped at the time limit." if sampling.late() else ""
    return f"{sampled_note(chosen, sampling, unit)} {plural(events, 'event')} read.{late}" if read else "No events."
