"""``--split train=0.98,val=0.02``: named fractions, assigned by a seed-free hash of each identity."""

from __future__ import annotations

import math

import numpy as np

from shardsmith.errors import UsageError


def parse_splits(text: str | None) -> dict[str, float]:
    """Ordered name → fraction; the fractions must sum to 1."""
    if not text:
        return {"train": 1.0}
    splits: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UsageError(f"--split: expected name=fraction pairs such as train=0.98,val=0.02, got {text!r}")
        try:
            fraction = float(value)
        except ValueError:
            raise UsageError(f"--split: {value!r} is not a number") from None
        if not 0 < fraction <= 1 or name in splits:
            raise UsageError(f"--split: {name}={value} must be a fraction in (0, 1], each name once")
        splits[name] = fraction
    if not math.isclose(sum(splits.values()), 1.0, abs_tol=1e-6):
        raise UsageError(f"--split: fractions sum to {sum(splits.values()):g}, not 1")
    return splits


def assign_splits(draws: np.ndarray, splits: dict[str, float]) -> np.ndarray:
    """The split index of each draw in [0, 1), by cumulative fraction in the order given."""
    edges = np.cumsum(list(splits.values()))[:-1]
    return np.searchsorted(edges, draws, side="right").astype(np.uint8)
