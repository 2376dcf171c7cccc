"""The interleave of a schedule whose shares change (``loader/schedule.py``): which source each
mixture sample comes from, every prefix within 1 of each source's scheduled count, with random
access, no array of the mixture's length, and exact integer arithmetic.

Shares are integers p[k][s] out of Q at the points x_0 = 0 < x_1 < ... < x_K and linear between
them, so a group G of sources (a sum of shares) has, in segment k (L = x_{k+1} - x_k; after the
last point L = 1 and the slope 0), the scheduled count

    F_G(x_k + d) = (U_k L + 2 P_k L d + Δ_k d²) / (2 L Q),   P_k = p_k(G), Δ_k = P_{k+1} - P_k,

with U_k = 2Q·F_G(x_k) an integer: exact rationals at every integer d (``_Group``).

The sources hang from a tree of depth at most 2 (up to four sources): the root splits the
positions between two groups, a group of two splits its own draws between its two sources. A node
N that has had m draws gives its rounded child X ``round(G_X(m))`` of them and the other child the
rest, where G_X(m) = F_X(τ(m)) is X's scheduled count at the moment τ(m) N's scheduled count
reaches m (for the root, τ(m) = m). G_X rises by at most 1 per draw of N (X's share is part of N's),
so each draw of N goes to exactly one child, and sample i is found by comparing
``round(G_X(c + 1))`` with ``round(G_X(c))`` down the tree: the segment by one binary search (in
``at``, or in N's U_k), then a few integer products and one integer square root (τ solves N's
quadratic; X's count at τ is linear in √S, whose floor ``math.isqrt`` gives exactly).

``_taken_at`` (the runs a batch asks for) first estimates round(G_X(m)) in floating point and keeps
an estimate only where G_X(m) + 1/2 is farther than ``TOLERANCE``·(1 + m) from an integer (the
float error is below 1e-15·(1 + m)); the others, and positions past 2**50, are computed exactly:
the same integers either way, most of them at numpy's speed.

The bound: the root's children are within 1/2 of their counts (one rounding). A source under a
group N is within 1/2 + |G_X(c_N) - G_X(F_N)| <= 1/2 + 1/2 (G_X and m - G_X both rise by at most
1 per unit of m, and N is within 1/2): within 1 at every prefix, for any weights. A third level
would add another half: hence four sources.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

TOLERANCE = 1e-11  # an estimate this close (relative to the draw count) to a rounding edge is recomputed exactly
FAST_LIMIT = 1 << 50  # draw counts up to here are estimated in float64 first


@dataclass(frozen=True)
class _Group:
    """A group of sources' shares, per segment k (0 .. K; segment K is after the last point)."""

    p: list[int]      # share at the segment's start (out of Q)
    delta: list[int]  # share at its end minus at its start (0 after the last point)
    u: list[int]      # 2Q · the scheduled count at its start

    @classmethod
    def of(cls, members: list[int], shares: list[list[int]], lengths: list[int]) -> _Group:
        p = [sum(row[s] for s in members) for row in shares]
        delta = [b - a for a, b in zip(p, p[1:])] + [0]
        u = [0]
        for k, length in enumerate(lengths[:-1]):
            u.append(u[-1] + (p[k] + p[k + 1]) * length)
        return cls(p=p, delta=delta, u=u)


@dataclass(frozen=True)
class _Node:
    """An inner node: ``rounded`` takes round(G(m)) of the node's m draws, ``other`` the rest."""

    group: _Group
    rounded: _Node | int
    rounded_group: _Group
    other: _Node | int
    floats: dict[str, np.ndarray]  # the groups' numbers per segment as float64 (``_estimate``)


class RampInterleave:
    """Up to four sources whose shares change linearly between points (see the module)."""

    def __init__(self, *, at: list[int], shares: list[list[int]], q: int) -> None:
        self.at = [int(x) for x in at]
        self.q = int(q)
        self.shares = [list(map(int, row)) for row in shares]
        self.lengths = [b - a for a, b in zip(self.at, self.at[1:])] + [1]  # after the last point: L = 1
        k = len(self.shares[0])
        self.weights = np.array(self.shares[0], dtype=np.float64) / self.q  # the shares at sample 0
        self.bound = 1.0  # proven (module docstring)
        mean = [sum(row[s] for row in self.shares) for s in range(k)]
        order = sorted(range(k), key=lambda s: (-mean[s], s))  # heaviest first
        # the heaviest alone (or with the lightest, of four) against the rest: any split keeps the bound
        halves = [[order[0], *order[3:]], order[1:3]] if k == 4 else [order[:1], order[1:]]
        self._root = self._build(order, halves)
        self._starts = np.array(self.at, dtype=np.int64)

    def _build(self, members: list[int], halves: list[list[int]] | None = None) -> _Node | int:
        if len(members) == 1:
            return members[0]
        a, b = halves if halves is not None else ([members[0]], members[1:])
        group, rounded = self._group(members), self._group(a)
        floats = {name: np.array(values, dtype=np.float64) for name, values in [
            ("u", group.u), ("p", group.p), ("delta", group.delta), ("xu", rounded.u), ("xp", rounded.p),
            ("xdelta", rounded.delta), ("length", self.lengths)]}
        return _Node(group=group, rounded=self._build(a), rounded_group=rounded, other=self._build(b), floats=floats)

    def _group(self, members: list[int]) -> _Group:
        return _Group.of(members, self.shares, self.lengths)

    def shares_at(self, n: float) -> np.ndarray:
        """Each source's share at position ``n`` (float: for reports)."""
        k = max(0, int(np.searchsorted(self._starts, int(n), side="right")) - 1)
        row = np.array(self.shares[k], dtype=np.float64)
        if k + 1 < len(self.at):
            t = (n - self.at[k]) / self.lengths[k]
            row = row + t * (np.array(self.shares[k + 1], dtype=np.float64) - row)
        return row / self.q

    # -- the rounded child's count, exactly --------------------------------------------------------

    def _taken(self, node: _Node, m: int) -> int:
        """round(G_X(m)): how many of node's first m draws its rounded child X has (module)."""
        if m <= 0:
            return 0
        g, x, q = node.group, node.rounded_group, self.q
        k = bisect_left(g.u, 2 * q * m) - 1  # U_k < 2Qm <= U_{k+1}
        last = len(g.u) - 1
        if k == last and g.p[k] == 0:  # past every draw the node is scheduled: X keeps its final count
            return (x.u[k] + q) // (2 * q)
        length = self.lengths[k]
        p, d, pa, da, ua = g.p[k], g.delta[k], x.p[k], x.delta[k], x.u[k]
        rest = 2 * q * m - g.u[k]  # M' = 2Q·(m - F_N(x_k)), > 0
        if d == 0:  # τ linear in m: d = M' / 2P
            num = 4 * p * p * ua * length + 4 * p * pa * length * rest + da * rest * rest + 4 * length * q * p * p
            return num // (8 * length * q * p * p)
        s = p * p * length * length + d * length * rest
        e = pa * d - p * da
        num = d * d * ua * length + d * da * length * rest - 2 * length * length * p * e + length * q * d * d
        v = 2 * length * e
        root = math.isqrt(v * v * s)
        z = root if v >= 0 else -root - (root * root != v * v * s)  # floor(v·√S)
        return (num + z) // (2 * length * q * d * d)

    def _taken_at(self, node: _Node, m: np.ndarray) -> np.ndarray:
        """``_taken`` of each of ``m`` (int64), each distinct value once: estimated, and computed
        exactly where the estimate is near a rounding edge (module docstring)."""
        values, inverse = np.unique(m, return_inverse=True)
        if values.size and values[-1] < FAST_LIMIT:
            got, unsure = self._estimate(node, values)
        else:
            got, unsure = np.zeros(len(values), dtype=np.int64), np.ones(len(values), dtype=bool)
        where = np.flatnonzero(unsure)
        if where.size:
            got[where] = self._exact_at(node, values[where])
        return got[inverse.reshape(-1)]

    def _exact_at(self, node: _Node, m: np.ndarray) -> np.ndarray:
        """``_taken`` of each of ``m``; where node and child both keep their shares through the segment
        (G_X linear: fixed weights' ties at every few draws), in int64 at once when it cannot overflow."""
        g, x, q = node.group, node.rounded_group, self.q
        out = np.zeros(len(m), dtype=np.int64)
        k = np.array([bisect_left(g.u, 2 * q * v) - 1 for v in m.tolist()], dtype=np.int64)
        for seg in np.unique(k).tolist():
            rows = np.flatnonzero(k == seg)
            p, pa = g.p[seg], x.p[seg]
            w = 2 * q * p
            linear = seg >= 0 and p > 0 and g.delta[seg] == 0 and x.delta[seg] == 0
            if linear and w * (int(m[rows[-1]]) + 1) < 1 << 62:
                # round(G) = floor((P·U_X - P_X·U_N + Q·P + 2Q·P_X·m) / 2QP), split so each part fits
                c1, c0 = divmod(p * x.u[seg] - pa * g.u[seg] + q * p, w)
                s1, s0 = divmod(2 * q * pa, w)
                out[rows] = c1 + s1 * m[rows] + (c0 + s0 * m[rows]) // w
            else:
                out[rows] = [self._taken(node, v) for v in m[rows].tolist()]
        return out

    def _estimate(self, node: _Node, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """round(G_X(m)) in float64 (``_taken``'s formulas, τ by the stable root), and where that is unsure."""
        f, q = node.floats, float(self.q)
        target = 2 * q * m.astype(np.float64)
        k = np.clip(np.searchsorted(f["u"], target, side="left") - 1, 0, len(f["u"]) - 1)
        length, p, delta = f["length"][k], f["p"][k], f["delta"][k]
        rest = target - f["u"][k]
        with np.errstate(all="ignore"):
            d = length * rest / (p * length + np.sqrt(p * p * length * length + delta * length * rest))
            y = (f["xu"][k] * length + 2 * f["xp"][k] * length * d + f["xdelta"][k] * d * d) / (2 * length * q) + 0.5
            edge = np.abs(y - np.round(y))
        unsure = ~(edge > TOLERANCE * (1 + m)) | (p == 0) & (k == len(f["u"]) - 1)  # nan is unsure too
        got = np.where(unsure, 0, np.floor(np.where(unsure, 0, y))).astype(np.int64)
        return got, unsure & (m > 0)

    # -- the interleave protocol ---------------------------------------------------------------------

    def counts(self, n: int) -> np.ndarray:
        out = np.zeros(len(self.shares[0]), dtype=np.int64)
        stack: list[tuple[_Node | int, int]] = [(self._root, int(n))]
        while stack:
            node, c = stack.pop()
            if isinstance(node, int):
                out[node] = c
                continue
            taken = self._taken(node, c)
            stack += [(node.rounded, taken), (node.other, c - taken)]
        return out

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.array(pos, dtype=np.int64).reshape(-1)
        source = np.zeros(len(pos), dtype=np.int64)
        stack: list[tuple[_Node | int, np.ndarray]] = [(self._root, np.arange(len(pos)))]
        while stack:  # down the tree: pos becomes the draw number inside each node
            node, rows = stack.pop()
            if isinstance(node, int):
                source[rows] = node
                continue
            if not rows.size:
                continue
            p = pos[rows]
            both = self._taken_at(node, np.concatenate([p, p + 1]))
            before, after = both[:len(p)], both[len(p):]
            taken = after > before
            pos[rows] = np.where(taken, before, p - before)
            stack += [(node.rounded, rows[taken]), (node.other, rows[~taken])]
        return source, pos
