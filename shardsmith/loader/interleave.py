"""The interleave of a mixture: which source each of its samples comes from, such that every
prefix of length n holds each source ``weight·n`` times, within 1, with random access and no
array of the mixture's length (numpy only).

Two constructions, one decision (``interleave``):

- ``TreeInterleave`` (up to four sources, any real weights): a binary tree over the sources. A
  node that holds c of the first n samples gives its lighter child (share r <= 1/2 of the node's
  weight) ``round(r·c)`` of them and the other child the rest; a source's count after n samples is
  a few roundings of n, and sample i goes down the tree by comparing ``round(r·(c+1))`` with
  ``round(r·c)``: O(depth) time and memory. Each rounding is off by at most 1/2 and the error of
  node j reaches a leaf of weight w scaled by w/W_j, so a leaf is within ``1/2 · (1 + Σ w/W_j)``
  over its ancestors below the root; with up to four sources every leaf is at depth <= 2, where
  that sum is one term w/W_1 < 1, so the bound is below 1. Deeper trees can pass 1.
- ``PeriodicInterleave`` (five sources or more): weights as fractions p_i/Q (exact when the
  weights are decimals or ratios whose common denominator Q is at most ``MAX_PERIOD``; else
  rounded to multiples of 1/``MAX_PERIOD``, the effective weights the mixture reports). The
  j-th draw of source i must fall at a position n (1-based) inside its quota window
  ``floor((j-1)·Q/p_i) + 1 <= n <= ceil(j·Q/p_i)``: then ``|count_i(n) - p_i·n/Q| < 1`` at every
  prefix. Such schedules exist for any number of sources (Balinski and Young's quota method;
  Tijdeman's chairman assignment bound 1 - 1/(2k-2)), and earliest-deadline-first over unit jobs
  with integer windows finds one. At n = Q every count is exactly p_i, so one period of Q
  positions (a source byte and a rank per position, 5·Q bytes, built once in ~20
  milliseconds) repeats for ever: sample i is O(1) away from ``i mod Q``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np

MAX_PERIOD = 1 << 16  # the longest period: 320 KB of table, ~20 ms to build; weight steps of 1.5e-5


class Interleave(Protocol):
    """Where each mixture position's sample comes from."""

    weights: np.ndarray  # the effective share of each source (sums to 1)
    bound: float  # proven: |count_i(n) - weights[i]·n| <= bound for every prefix n

    def counts(self, n: int) -> np.ndarray:
        """How many of the first n positions each source holds (int64, one per source)."""

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, draw number inside the source) of positions ``pos`` (int64 arrays)."""


def interleave(weights: list[float]) -> Interleave:
    """The interleave for these positive weights (normalised here): a tree up to four sources, else
    one period of a quota schedule."""
    if len(weights) <= 4:
        return TreeInterleave(weights=weights)
    return PeriodicInterleave(shares=_fractions(weights))


# ---- up to four sources: a tree of two-way roundings ------------------------------------------

@dataclass(frozen=True)
class _Node:
    """An inner node: ``light`` takes ``round(share · c)`` of the node's c samples."""

    share: float
    light: _Node | int
    heavy: _Node | int


def _take(share: float, c: np.ndarray) -> np.ndarray:
    """How many of a node's first c samples go to its lighter child: round(share · c)."""
    return np.floor(share * c + 0.5).astype(np.int64)


class TreeInterleave:
    """Up to four sources, any real weights (module docstring)."""

    def __init__(self, *, weights: list[float]) -> None:
        scaled = [float(w) / float(max(weights)) for w in weights]  # no overflow of a sum of huge weights
        self.weights = np.array(scaled, dtype=np.float64) / sum(scaled)
        order = sorted(range(len(weights)), key=lambda s: (-self.weights[s], s))
        self._tree = self._split(order)
        self.bound = max(self._bounds(self._tree, []).values())

    def _split(self, members: list[int]) -> _Node | int:
        """Sources (heaviest first) into two groups of balanced weight, each split again."""
        if len(members) == 1:
            return members[0]
        groups: tuple[list[int], list[int]] = ([], [])
        totals = [0.0, 0.0]
        size = -(-len(members) // 2)
        for s in members:  # heaviest first into the lighter group, at most half of them per group
            g = 0 if (totals[0] <= totals[1] and len(groups[0]) < size) or len(groups[1]) >= size else 1
            groups[g].append(s)
            totals[g] += self.weights[s]
        light, heavy = (0, 1) if totals[0] <= totals[1] else (1, 0)
        share = totals[light] / (totals[0] + totals[1])
        return _Node(share, self._split(groups[light]), self._split(groups[heavy]))

    def _weight(self, node: _Node | int) -> float:
        return float(self.weights[node]) if isinstance(node, int) else self._weight(node.light) + self._weight(node.heavy)

    def _bounds(self, node: _Node | int, above: list[float]) -> dict[int, float]:
        """Each source's proven bound, 1/2 · (1 + Σ w/W) over the nodes below the root above it."""
        if isinstance(node, int):
            w = float(self.weights[node])
            return {node: 0.5 * (1 + sum(w / W for W in above[1:]))} if above else {node: 0.0}
        total = self._weight(node)
        out = self._bounds(node.light, [*above, total])
        out.update(self._bounds(node.heavy, [*above, total]))
        return out

    def counts(self, n: int) -> np.ndarray:
        out = np.zeros(len(self.weights), dtype=np.int64)
        stack: list[tuple[_Node | int, int]] = [(self._tree, int(n))]
        while stack:
            node, c = stack.pop()
            if isinstance(node, int):
                out[node] = c
                continue
            light = int(_take(node.share, np.int64(c)))
            stack += [(node.light, light), (node.heavy, c - light)]
        return out

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.array(pos, dtype=np.int64)
        source = np.full(len(pos), -1, dtype=np.int64)
        stack: list[tuple[_Node | int, np.ndarray]] = [(self._tree, np.arange(len(pos)))]
        while stack:  # down the tree: pos becomes the rank inside each node's share
            node, rows = stack.pop()
            if isinstance(node, int):
                source[rows] = node
                continue
            p = pos[rows]
            before = _take(node.share, p)
            light = _take(node.share, p + 1) > before
            pos[rows] = np.where(light, before, p - before)
            stack += [(node.light, rows[light]), (node.heavy, rows[~light])]
        return source, pos


# ---- five sources or more: one period of a quota schedule -------------------------------------

def _fractions(weights: list[float]) -> list[int]:
    """The weights as integer shares p_i of a period Q = Σ p_i <= MAX_PERIOD (each p_i >= 1): exact
    for decimals as written (0.3 is 3/10) and integer ratios, else the nearest multiples of 1/MAX_PERIOD."""
    exact = [Fraction(repr(float(w))) if isinstance(w, float) else Fraction(w) for w in weights]
    total = sum(exact)
    shares = [w / total for w in exact]
    period = math.lcm(*(s.denominator for s in shares))
    if period <= MAX_PERIOD:
        return [int(s * period) for s in shares]
    scaled = [float(s) * MAX_PERIOD for s in shares]
    p = [max(1, math.floor(x)) for x in scaled]
    by_remainder = sorted(range(len(p)), key=lambda i: (-(scaled[i] - math.floor(scaled[i])), i))
    for i in by_remainder[:max(MAX_PERIOD - sum(p), 0)]:  # fewer than k slots left: largest remainders
        p[i] += 1
    while sum(p) > MAX_PERIOD:  # sources raised to 1 took slots: the largest give them back
        p[max(range(len(p)), key=lambda i: (p[i], -i))] -= 1
    g = math.gcd(*p)
    return [x // g for x in p]


class PeriodicInterleave:
    """Five sources or more (module docstring): p_i draws of source i in every Q = Σ p_i positions."""

    def __init__(self, *, shares: list[int]) -> None:
        self.shares = np.array(shares, dtype=np.int64)
        self.period = int(self.shares.sum())
        self.weights = self.shares / self.period
        self.bound = 1 - 1 / self.period  # |count - p·n/Q| < 1 and a multiple of 1/Q
        self._source = self._schedule(shares)
        self._rank = np.empty(self.period, dtype=np.uint32)
        for s in range(len(shares)):
            where = np.flatnonzero(self._source == s)
            self._rank[where] = np.arange(len(where), dtype=np.uint32)

    @staticmethod
    def _schedule(p: list[int]) -> np.ndarray:
        """One period, earliest deadline first over the quota windows (module docstring). Every draw's
        window is known up front (numpy), so the loop only releases draws in release order into one
        heap keyed by ``deadline·k + source`` (ties to the lower source) and takes its smallest."""
        q, k = sum(p), len(p)
        shares = np.asarray(p, dtype=np.int64)
        source = np.repeat(np.arange(k, dtype=np.int64), shares)
        j = np.arange(q, dtype=np.int64) - np.repeat(np.cumsum(shares) - shares, shares) + 1  # draw j of its source
        release = (j - 1) * q // shares[source] + 1  # floor((j-1)·Q/p) + 1
        deadline = -(-(j * q) // shares[source])  # ceil(j·Q/p)
        order = np.lexsort((source, release))
        keys, releases = (deadline * k + source)[order].tolist(), release[order].tolist()
        out, ready, at = [0] * q, [], 0
        push, pop = heapq.heappush, heapq.heappop
        for t in range(1, q + 1):
            while at < q and releases[at] <= t:
                push(ready, keys[at])
                at += 1
            key = pop(ready)
            if key // k < t:  # pragma: no cover - quota windows always admit a schedule
                raise AssertionError(f"quota schedule missed a deadline at {t} of {q}")
            out[t - 1] = key % k
        return np.array(out, dtype=np.min_scalar_type(k))

    def counts(self, n: int) -> np.ndarray:
        whole, part = divmod(int(n), self.period)
        return whole * self.shares + np.bincount(self._source[:part], minlength=len(self.shares)).astype(np.int64)

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        whole, part = np.divmod(np.asarray(pos, dtype=np.int64), self.period)
        source = self._source[part].astype(np.int64)
        return source, whole * self.shares[source] + self._rank[part]
