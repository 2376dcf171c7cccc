"""Where shards end: one greedy rule shared by every writer and by the gather's plan.

A shard takes samples in output order while it holds fewer than ``max_samples`` and its weight
(tokens, tar bytes, event bytes: the writer says which) stays within ``max_weight``; a sample
heavier than a whole shard gets a shard of its own. The rule looks at nothing but the weights in
order and restarts from an empty shard at every boundary, so a writer that starts at a planned
boundary cuts exactly where one writer going through the whole split would: this is what lets
cluster ranks (and gather workers) each write a contiguous range of the shards.
"""

from __future__ import annotations

import numpy as np

UNLIMITED = 1 << 62


class Rollover:
    """The state of the shard being filled: samples and weight so far."""

    def __init__(self, *, max_weight: int, max_samples: int | None = None) -> None:
        self.max_weight = int(max_weight)
        self.max_samples = int(max_samples or UNLIMITED)
        self.count = 0
        self.weight = 0

    def takes_whole(self, weight: int, count: int) -> bool:
        """Take ``count`` samples of total ``weight`` into the shard being filled if they fit in it
        whole (then ``cut`` of them would find no boundary, and their weights one by one are not
        needed: the gather's plan skips reading such a group); otherwise take nothing."""
        if self.weight + weight > self.max_weight or self.count + count > self.max_samples:
            return False
        self.weight += weight
        self.count += count
        return True

    def cut(self, weights: np.ndarray) -> list[int]:
        """The positions in ``weights`` before which a new shard starts (0 when the shard being
        filled is full), taking the samples into the shard being filled."""
        ends = np.cumsum(np.asarray(weights, dtype=np.int64))
        n = len(ends)
        breaks: list[int] = []
        pos = 0
        while pos < n:
            base = int(ends[pos - 1]) if pos else 0
            fit = int(np.searchsorted(ends[pos:], base + self.max_weight - self.weight, side="right"))
            fit = min(fit, self.max_samples - self.count, n - pos)
            if fit <= 0:
                if self.count:
                    breaks.append(pos)
                    self.count = self.weight = 0
                    continue
                fit = 1  # heavier than a whole shard: a shard of its own
            self.count += fit
            self.weight += int(ends[pos + fit - 1]) - base
            pos += fit
        return breaks


def shard_bounds(weights: np.ndarray, *, max_weight: int, max_samples: int | None = None) -> np.ndarray:
    """Sample positions where each shard of a whole split starts, plus the split's end."""
    cuts = Rollover(max_weight=max_weight, max_samples=max_samples).cut(weights)
    n = len(weights)
    return np.asarray([0, *cuts, n] if n else [0], dtype=np.int64)


def runs(breaks: list[int], n: int) -> list[tuple[int, int, bool]]:
    """``(start, stop, starts_a_shard)`` for the runs of a batch of ``n`` samples cut at ``breaks``."""
    starts = set(breaks)
    edges = [0, *breaks, n]
    return [(a, b, a in starts) for a, b in zip(edges[:-1], edges[1:]) if b > a]
