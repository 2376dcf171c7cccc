"""Mixture weights that change over training: ``Schedule(at=[...], weights={...})``.

A schedule names points on the mixture's sample index (``at``: 0 first, increasing) and each
source's weight at every point (a number: the same at every point). ``unit="tokens"`` gives the
points in tokens, for sources of a fixed number of tokens per sample (their kind's ``seq_len``:
token windows, packed rows): point t is sample t / seq_len, so t must be a multiple of it. Documents
hold varying numbers of tokens: where token t falls would depend on every sample drawn before it. The weights are normalised
at each point; between two points each source's *share* moves linearly, after the last point it
stays. A source's scheduled count after n samples is the integral of its share over [0, n]; the
interleave (``loader/ramp.py``) keeps every prefix within 1 of it. A fixed mixture is a schedule
of one point (``Schedule.fixed``), read by the fixed interleave exactly as before.

Shares are kept as integers p out of a common Q at every point (exact for weights written as
decimals or integer ratios, whose common denominator is at most ``MAX_Q``; else rounded to
multiples of 1/``MAX_PERIOD``, a positive weight keeping at least one part): the interleave's
arithmetic is then exact (Python integers), whatever the length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from shardsmith.core.manifest import MAX_COUNT
from shardsmith.errors import UsageError
from shardsmith.loader.interleave import MAX_PERIOD, Interleave, interleave

MAX_Q = 1 << 40  # the largest exact common denominator of every point's shares
RAMP_SOURCES = 4  # a schedule whose shares change mixes up to four sources (``loader/ramp.py``: the bound)
UNITS = ("samples", "tokens")  # what ``at`` counts


def _exact(w: Any) -> Fraction:
    """A weight as written: 0.3 is 3/10 (its shortest repr), an int itself."""
    return Fraction(repr(float(w))) if isinstance(w, float | np.floating) else Fraction(int(w))


def _grid(shares: list[Fraction], q: int) -> list[int]:
    """Shares (summing to 1) as integers out of q by largest remainders; zero stays zero, a positive
    share keeps at least 1."""
    scaled = [s * q for s in shares]
    p = [max(1, math.floor(x)) if x > 0 else 0 for x in scaled]
    by_remainder = sorted(range(len(p)), key=lambda i: (-(scaled[i] - math.floor(scaled[i])), i))
    for i in [i for i in by_remainder if scaled[i] > 0][:max(q - sum(p), 0)]:
        p[i] += 1
    while sum(p) > q:  # positives raised to 1 took parts: the largest give them back
        p[max(range(len(p)), key=lambda i: (p[i], -i))] -= 1
    return p


class Schedule:
    """Piecewise-linear mixture weights over the sample index (see the module).

    ``at``: the points (sample positions, 0 first, strictly increasing; ``unit="tokens"``: token
    positions); ``weights``: source name -> a number (the same at every point) or one weight per
    point (non-negative; at each point one source at least is positive; each source positive at
    some point).
    """

    def __init__(self, *, at: Sequence[int], weights: Mapping[str, Any], unit: str = "samples") -> None:
        if unit not in UNITS:
            raise UsageError(f"schedule: unit={unit!r}: points count 'samples' or 'tokens'")
        self.unit = unit
        at = at.tolist() if isinstance(at, np.ndarray) else at
        if isinstance(at, (str, bytes)) or not isinstance(at, Sequence) or not at:
            raise UsageError(f"schedule: at= must be a list of sample positions, not {at!r}"[:200])
        for x in at:
            if isinstance(x, bool) or not isinstance(x, int | np.integer) or not 0 <= x <= MAX_COUNT:
                raise UsageError(f"schedule: at= holds {x!r}; points are sample positions (0 to 2**62)")
        if int(at[0]) != 0 or any(int(b) <= int(a) for a, b in zip(at, at[1:])):
            raise UsageError(f"schedule: at= must start at 0 and increase, not {list(at)!r}"[:200])
        if not isinstance(weights, Mapping) or not weights:
            raise UsageError("schedule: weights= must map each source's name to its weights")
        self.at = [int(x) for x in at]
        self.weights: dict[str, list[float]] = {}
        for name, w in weights.items():
            listed = isinstance(w, Sequence | np.ndarray) and not isinstance(w, str)
            row = list(np.asarray(w).tolist()) if listed else [w] * len(self.at)
            if len(row) != len(self.at):
                raise UsageError(f"schedule: {name!r} has {len(row)} weights for {len(self.at)} points (at=)")
            for x in row:
                if isinstance(x, bool) or not isinstance(x, int | float | np.integer | np.floating) \
                        or not math.isfinite(x) or x < 0:
                    raise UsageError(f"schedule: a weight of {name!r} is {x!r}; weights are numbers >= 0")
            if not any(row):
                raise UsageError(f"schedule: {name!r} has weight 0 at every point: it would never be drawn")
            self.weights[str(name)] = row
        for k, x in enumerate(self.at):
            if not any(row[k] for row in self.weights.values()):
                raise UsageError(f"schedule: every weight is 0 at sample {x}")

    @classmethod
    def fixed(cls, weights: Mapping[str, Any], *, checked: bool = False) -> Schedule:
        """Fixed weights: a schedule of one point (``checked``: ``mix`` has checked them already, and
        a mixture is made in microseconds: the checks are not run twice)."""
        if not checked:
            return cls(at=[0], weights=weights)
        schedule = cls.__new__(cls)
        schedule.at, schedule.weights, schedule.unit = [0], {str(n): [w] for n, w in weights.items()}, "samples"
        return schedule

    def in_samples(self, tokens_per_sample: Any) -> Schedule:
        """This schedule with its points in samples (``unit="tokens"``: each divided by the sources'
        tokens per sample, their kind's ``seq_len``; None: they have no fixed number, refused)."""
        if self.unit == "samples":
            return self
        if type(tokens_per_sample) is not int or tokens_per_sample < 1:
            raise UsageError("schedule: unit='tokens' needs sources of a fixed number of tokens per sample (token "
                             "windows, packed rows: a seq_len); documents vary, give their points in samples")
        uneven = [x for x in self.at if x % tokens_per_sample]
        if uneven:
            raise UsageError(f"schedule: point {uneven[0]:,} tokens is not a whole number of samples of "
                             f"{tokens_per_sample} tokens")
        return Schedule(at=[x // tokens_per_sample for x in self.at], weights=self.weights)

    def __repr__(self) -> str:
        unit = "" if self.unit == "samples" else f", unit={self.unit!r}"
        return f"Schedule(at={self.at!r}, weights={self.weights!r}{unit})"

    def _points(self, names: list[str]) -> list[list[Fraction]]:
        """Each point's shares in ``names`` order (exact fractions summing to 1)."""
        out = []
        for k in range(len(self.at)):
            row = [_exact(self.weights[n][k]) for n in names]
            total = sum(row)
            out.append([w / total for w in row])
        return out

    def ramps(self, names: list[str]) -> bool:
        """Whether the shares change (else the fixed interleave reads it)."""
        if len(self.at) == 1:
            return False
        points = self._points(names)
        return any(p != points[0] for p in points[1:])

    def interleave(self, names: list[str]) -> Interleave:
        """The interleave of this schedule (the one place that chooses): shares that never change
        are fixed weights (``interleave``, for any number of sources, the first point's weights as
        given); shares that change: ``RampInterleave``, up to four sources."""
        if not self.ramps(names):
            return interleave([self.weights[n][0] for n in names])
        if len(names) > RAMP_SOURCES:
            raise UsageError(f"schedule: weights that change mix up to {RAMP_SOURCES} sources ({len(names)} given; "
                             f"group sources into fixed mixtures and schedule the groups)")
        from shardsmith.loader.ramp import RampInterleave

        points = self._points(names)
        q = math.lcm(*(s.denominator for p in points for s in p))
        if q > MAX_Q:
            q = MAX_PERIOD
            shares = [_grid(p, q) for p in points]
        else:
            shares = [[int(s * q) for s in p] for p in points]
        return RampInterleave(at=self.at, shares=shares, q=q)
