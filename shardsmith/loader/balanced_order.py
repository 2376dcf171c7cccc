"""Class-balanced epoch orders for labelled datasets (numpy only; ``BalancedSampler`` in
``shardsmith.loader.balance_sampler`` walks them, ``shardsmith.torch`` re-exports it).

An epoch of ``n`` draws is built in two steps, both pure functions of (labels, weights, n, seed,
epoch), so the order is the same on every rank and machine:

1. **Which class each draw takes**: a smooth deterministic interleave (``class_sequence``, WF2Q's
   rule): at every prefix of length t the count of class c stays within one draw of ``w_c · t``
   (tested with hypothesis), for any number of classes and weights -- no sampling noise.
2. **Which sample of the class**: each class is read in its own shuffled order (a permutation of
   its members by the same 64-bit mixing as ``epoch_order``), without replacement, so within an
   epoch a sample repeats only after every member of its class has been drawn. A class that runs
   out (its weight asks for more draws than it has samples) **cycles** into its next pass, a new
   shuffled order of the same members; ``BalanceReport`` counts those repeated draws per class.

Memory is O(classes + n) int64 arrays; the labels are read once (``read_labels``).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.kit.keys import mix64, path_hash

INVERSE = "inverse"  # weights: every class present gets an equal share (inverse frequency per sample)


def read_labels(dataset: Any, field: str | None = None) -> np.ndarray:
    """Every sample's integer label, in index order, read once: the dataset's ``labels(field)``
    (tar ``cls`` members, an event field) or an array (any sequence of ints) given as is."""
    if hasattr(dataset, "labels") and callable(dataset.labels):
        labels = dataset.labels() if field is None else dataset.labels(field)
    else:
        labels = dataset
    out = np.asarray(labels)
    if out.ndim != 1 or (out.size and out.dtype.kind not in "iu"):
        raise ValueError(f"labels must be one integer per sample, got an array of {out.dtype} with shape {out.shape}")
    if out.size and out.min() < 0:
        raise ValueError(f"labels must be >= 0, found {int(out.min())}")
    return out.astype(np.int64, copy=False)


def class_weights(counts: np.ndarray, weights: str | Mapping[Any, float] | Sequence[float],
                  names: Sequence[str] | None = None) -> np.ndarray:
    """Normalised per-class weights (one per label value): ``"inverse"`` (equal shares among the
    classes present), a sequence (one per label), or a mapping of label or class name to weight
    (classes left out get 0). A class with weight but no sample is refused."""
    c = len(counts)
    if isinstance(weights, str):
        if weights != INVERSE:
            raise ValueError(f"weights={weights!r}: give {INVERSE!r}, a sequence or a mapping")
        w = (counts > 0).astype(np.float64)
    elif isinstance(weights, Mapping):
        w = np.zeros(c, np.float64)
        index = {name: i for i, name in enumerate(names or ())}
        for key, value in weights.items():
            label = index.get(key, key)
            if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or not 0 <= label < c:
                raise ValueError(f"weights: {key!r} is not a class of this dataset")
            w[int(label)] = float(value)
    else:
        w = np.asarray(weights, np.float64)
        if w.shape != (c,):
            raise ValueError(f"weights: {w.size} given for {c} classes")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be finite, >= 0, and not all 0")
    empty = np.flatnonzero((w > 0) & (counts == 0))
    if empty.size:
        raise ValueError(f"class {int(empty[0])} has a weight but no samples")
    return w / w.sum()


def class_sequence(weights: np.ndarray, n: int, *, seed: int) -> np.ndarray:
    """The class of each of ``n`` draws, by worst-case fair weighted fair queueing (WF2Q): the k-th
    draw of class c may start at ``k / w_c`` and should finish by ``(k + 1) / w_c``; draw t takes,
    among the draws that may start by t, the one due first (ties: a seeded order of the classes).
    Every prefix of length t then holds ``w_c · t`` draws of class c within one (Bennett and Zhang,
    1996), whatever the number of classes or their weights."""
    tie = mix64(np.uint64(path_hash("balance-ties", str(seed))) ^ mix64(np.arange(len(weights), dtype=np.uint64) + 1))
    live = np.flatnonzero(weights > 0)
    if np.all(weights[live] == weights[live[0]]):  # equal shares ("inverse"): the same rule is a round robin
        turn = live[np.argsort(tie[live], kind="stable")]
        return np.resize(turn, n).astype(np.int64)
    return _wf2q(weights, n, np.argsort(np.argsort(tie, kind="stable"), kind="stable").tolist())


def _wf2q(weights: np.ndarray, n: int, rank: list[int]) -> np.ndarray:
    """``class_sequence``'s rule, one draw at a time: two heaps of the classes, O(n log classes)."""
    live = np.flatnonzero(weights > 0).tolist()
    w = weights.tolist()
    waiting = [(0.0, rank[c], c) for c in live]  # (may start, tie, class)
    heapq.heapify(waiting)
    ready: list[tuple[float, int, int]] = []  # (due, tie, class)
    drawn = [0] * len(weights)
    out = np.empty(n, np.int64)
    push, pop = heapq.heappush, heapq.heappop
    for t in range(n):
        while waiting and (waiting[0][0] <= t or not ready):
            _, r, c = pop(waiting)
            push(ready, ((drawn[c] + 1) / w[c], r, c))
        _, r, c = pop(ready)
        out[t] = c
        drawn[c] += 1
        push(waiting, (drawn[c] / w[c], r, c))
    return out


@dataclass(frozen=True)
class BalanceReport:
    """One epoch's draws per class: ``drawn``, the class's ``samples``, and ``repeated`` (draws
    after the class ran out and cycled into another pass of its shuffled order)."""

    drawn: np.ndarray
    samples: np.ndarray

    @property
    def repeated(self) -> np.ndarray:
        return np.maximum(self.drawn - self.samples, 0)

    def as_dict(self, names: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        name = (lambda c: names[c]) if names else str
        return {name(c): {"drawn": int(self.drawn[c]), "samples": int(self.samples[c]),
                          "repeated": int(self.repeated[c])}
                for c in range(len(self.drawn)) if self.drawn[c] or self.samples[c]}


class BalancedOrder:
    """One epoch's order of dataset indices, class-balanced (the module docstring says how).

    Called as ``EpochOrder`` is (``order(n, shuffle=, seed=, epoch=)``; ``n`` is the epoch's
    number of draws); ``name`` identifies the labels and weights, so a loader state or global
    position of another balance is refused.
    """

    def __init__(self, labels: np.ndarray, weights: str | Mapping[Any, float] | Sequence[float] = INVERSE,
                 *, names: Sequence[str] | None = None) -> None:
        self.labels = read_labels(labels)
        listed = 0 if isinstance(weights, (str, Mapping)) else len(weights)  # classes a weight list names
        self.counts = np.bincount(self.labels, minlength=max(len(names or ()), listed))
        self.weights = class_weights(self.counts, weights, names)
        self.names = list(names) if names else None
        self._members = np.argsort(self.labels, kind="stable")  # sample indices grouped by class
        self._first = np.concatenate([[0], np.cumsum(self.counts)])
        digest = hashlib.sha256(self.labels.tobytes() + self.weights.tobytes()).hexdigest()[:16]
        self.name = f"balanced:{digest}"

    def classes_of(self, n: int, *, seed: int) -> np.ndarray:
        return class_sequence(self.weights, n, seed=seed)

    def report(self, n: int, *, seed: int) -> BalanceReport:
        drawn = np.bincount(self.classes_of(n, seed=seed), minlength=len(self.counts))
        return BalanceReport(drawn=drawn, samples=self.counts.copy())

    def __call__(self, n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
        seq = self.classes_of(n, seed=seed)
        drawn = np.bincount(seq, minlength=len(self.counts))
        by_class = np.argsort(seq, kind="stable")  # the draws of each class, in time order
        out = np.empty(n, np.int64)
        at = 0
        for c in np.flatnonzero(drawn).tolist():
            d, m = int(drawn[c]), int(self.counts[c])
            members = self._members[self._first[c]:self._first[c] + m]
            out[by_class[at:at + d]] = members[self._passes(c, d, m, shuffle=shuffle, seed=seed, epoch=epoch)]
            at += d
        return out

    @staticmethod
    def _passes(c: int, d: int, m: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
        """``d`` draws from a class of ``m`` members: positions in pass after pass of its shuffled order."""
        passes = -(-d // m)
        member = np.tile(np.arange(m, dtype=np.int64), passes)
        if not shuffle:
            return member[:d]
        which = np.repeat(np.arange(passes, dtype=np.uint64), m)
        base = mix64(np.uint64(path_hash(f"balance:{seed}", f"{epoch}:{c}")) + np.arange(passes, dtype=np.uint64))
        keys = mix64(base[which] ^ mix64(member.astype(np.uint64) + np.uint64(1)))
        return member[np.lexsort((keys, which))][:d]
