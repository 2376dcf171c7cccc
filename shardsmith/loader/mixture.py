"""Weighted mixtures of datasets: ``mix(sources, weights, seed=...)`` is a random-access dataset
whose sample i is drawn from one source, in a smooth deterministic interleave, with no array of
the mixture's length anywhere (numpy only).

Which source sample i comes from is the interleave's decision (``loader/interleave.py``): every
prefix of length n holds each source ``weight·n`` times, within 1, for any number of sources
(``deviation_bound`` is the proven bound, below 1; tests/test_mix.py checks it with hypothesis).

Each source is read in its own shuffled order: draw j of source s is position ``j mod len`` of a
keyed Feistel permutation (cycle-walking, O(1) memory) for that source's pass ``j // len``; a
source that runs out cycles into a new pass (``epochs``, ``cycling``; ``exhausted="stop"`` ends
the mixture where the first source would start its second pass instead). ``state(n)`` records
how many draws each source has had after the first n samples; ``mix(..., start=state)`` with new
weights continues every source from there (nothing is re-converted).

Weights may change over training: a ``Schedule`` (``loader/schedule.py``) gives each source's
weight at points of the sample index, linear between them; the interleave keeps every prefix
within 1 of each source's scheduled count (``loader/ramp.py``). Fixed weights are a schedule of
one point, read exactly as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardsmith.core.manifest import MAX_COUNT
from shardsmith.core.user_warning import warn_user
from shardsmith.errors import UsageError
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.keys import mix64, path_hash
from shardsmith.kit.rank_split import same
from shardsmith.kit.sample_kind import SampleKind
from shardsmith.loader.schedule import Schedule

MIX_STATE = "shardsmith.mix/1"  # marks what ``Mixture.state`` returns (``start=`` of ``mix``)
AHEAD = 1 << 14  # positions located at once when batches ask for runs of them
EXHAUSTED = ("repeat", "stop")  # what a mixture does when a source runs out (``mix``)


_GOLD, _MUL = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)


def _permute_run(p: np.ndarray, n: int, key: np.uint64) -> np.ndarray:
    """Position p of a keyed pseudo-random permutation of range(n), for one source's pass (one n,
    one key): an unbalanced 4-round Feistel network on the bits of n - 1 (a domain under 2n),
    multiply-xorshift rounds in wrapping uint64, walking each cycle back into range(n). Scalars
    and rounds in place; tests/test_mix.py keeps the vectorised form it replaced as the reference."""
    bits = (n - 1).bit_length()
    sizes = (bits // 2, bits - bits // 2)
    masks = {w: np.uint64((1 << w) - 1) for w in sizes}
    keys = [np.uint64((int(key) + r * 0x9E3779B97F4A7C15) % 2**64) for r in range(1, 5)]

    def feistel(x: np.ndarray) -> np.ndarray:
        top, low = sizes
        hi, lo = x >> np.uint64(low), x & masks[low]
        for k in keys:
            f = lo ^ k
            f *= _GOLD
            f ^= f >> np.uint64(29)
            f *= _MUL
            f ^= f >> np.uint64(32)
            f &= masks[top]
            f ^= hi
            hi, lo, top, low = lo, f, low, top
        hi <<= np.uint64(low)
        hi |= lo
        return hi

    y = feistel(p.astype(np.uint64))
    bound = np.uint64(n)
    out = np.flatnonzero(y >= bound)
    while out.size:  # walk the cycle back into range(n): a bijection stays a bijection
        y[out] = feistel(y[out])
        out = out[y[out] >= bound]
    return y.astype(np.int64)


def _check(sources: Mapping[str, Any], weights: Mapping[str, float] | Schedule) -> Schedule:
    """The sources and weights checked; the weights as a schedule (fixed ones: of one point)."""
    if not isinstance(sources, Mapping) or not sources:
        raise UsageError("mix: give sources as a non-empty dict name -> dataset")
    named = weights.weights if isinstance(weights, Schedule) else weights
    if not isinstance(named, Mapping) or set(named) != set(sources):
        named = named if isinstance(named, Mapping) else {}
        extra, missing = sorted(set(named) - set(sources)), sorted(set(sources) - set(named))
        raise UsageError(f"mix: weights must name exactly the sources (unknown: {extra}, without a weight: {missing})")
    if not isinstance(weights, Schedule):
        for name, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not np.isfinite(w) or w <= 0:
                raise UsageError(f"mix: weight of {name!r} is {w!r}; weights must be positive numbers")
    for name, ds in sources.items():
        if not isinstance(ds, Dataset):
            raise UsageError(f"mix: source {name!r} is a {type(ds).__name__}, not a loader dataset (a shardsmith "
                             f"dataset, or a plugin's: shardsmith.plugin.Dataset)")
    first = next(iter(sources))
    for name, ds in sources.items():
        differs = sources[first].kind.difference(ds.kind)
        if differs is not None:
            raise UsageError(f"mix: {name!r} holds another kind of sample than {first!r}: {differs} (sources "
                             f"share their kind of sample, window length, schema, tokenizers and pad ids)")
        if len(ds) == 0:
            raise UsageError(f"mix: source {name!r} is empty")
    return weights if isinstance(weights, Schedule) else Schedule.fixed(weights, checked=True)


def _counts(value: Any, name: str) -> dict[str, int]:
    """A ``state``'s ``consumed`` or ``lengths``: source name -> count (an int in [0, 2**62]; a bool or a
    float is none), refused in one line otherwise (a count past 2**62 would overflow the draws)."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and type(v) is int and 0 <= v <= MAX_COUNT
                                                 for k, v in value.items()):
        raise UsageError(f"mix: start= {name} must map each source's name to a count, not {value!r}"[:300])
    return dict(value)


class Mixture(Dataset):
    """A random-access weighted mixture (make it with ``mix``): ``len``, ``m[i]``, ``get_batch``,
    ``source_of(i)``, ``state(n)``; ``epochs`` / ``cycling`` say which sources repeat. A loader
    dataset of its sources' kind: ``m.iter``, the torch adapters (``MixBatches``) and mixtures of
    mixtures read it; in order (``shuffle=False``, ``MixBatches``' way) every prefix keeps the weights.
    ``schedule``: the weights as given (a ``Schedule``; fixed weights: one point); ``report(n)``: each
    source's share, draws and passes after n samples."""

    def __init__(self, sources: Mapping[str, Any], weights: Mapping[str, float] | Schedule, *, seed: int,
                 num_samples: int | None, shuffle: bool, start: Mapping[str, Any] | None,
                 exhausted: str = "repeat") -> None:
        given = _check(sources, weights)
        # points given in tokens: in samples of the sources' tokens per sample (their kind's seq_len)
        self.schedule = given.in_samples(dict(next(iter(sources.values())).kind.traits).get("seq_len"))
        if exhausted not in EXHAUSTED:
            raise UsageError(f"mix: exhausted={exhausted!r}: a source that runs out either starts a new pass "
                             f"('repeat') or ends the mixture ('stop')")
        self.exhausted = exhausted
        self.names = list(sources)
        self.ramps = self.schedule.ramps(self.names)  # the shares change over the mixture
        self._interleave = self.schedule.interleave(self.names)
        # the effective shares (at sample 0, for a schedule): the given ones normalised (with five
        # sources or more, rounded to a period of at most 65,536 positions when their common
        # denominator is larger)
        self.weights = {n: float(w) for n, w in zip(self.names, self._interleave.weights)}
        self.deviation_bound = float(self._interleave.bound)  # proven: below 1 (fixed), at most 1 (schedule)
        self.sources = dict(sources)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise UsageError(f"mix: seed={seed!r} must be an integer")
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int | np.integer)
                                        or not 0 <= num_samples <= MAX_COUNT):
            raise UsageError(f"mix: num_samples={num_samples!r} must be a count in [0, 2**62]")
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.lengths = {name: len(ds) for name, ds in sources.items()}
        self._kind = self.sources[self.names[0]].kind
        self.consumed = self._start(start)
        self._ahead: tuple[int, np.ndarray, np.ndarray] | None = None  # (first position, sources, samples)
        self._after = -1  # the position after the last run located
        self.ahead = AHEAD  # positions located at once for a run
        self._keys = np.array([path_hash(f"mix:{self.seed}", n) for n in self.names], dtype=np.uint64)
        self._len = self._no_repeats() if num_samples is None else int(num_samples)
        if exhausted == "stop" and num_samples is not None:
            self._len = min(self._len, self._no_repeats())
        ends = self.counts(self._len)
        self.epochs = {n: (self.consumed[n] + ends[n]) / self.lengths[n] for n in self.names}
        self.cycling = [n for n in self.names if self.consumed[n] + ends[n] > self.lengths[n]]
        if self.cycling:
            warn_user(f"mix: sources {self.cycling} run out and start a new shuffled pass "
                      f"(passes: {', '.join(f'{n}={self.epochs[n]:.2f}' for n in self.cycling)})")

    def _start(self, start: Mapping[str, Any] | None) -> dict[str, int]:
        """Draws each source has had before this mixture (from ``state``); unknown sources carry over."""
        self._carried: dict[str, Any] = {}
        if start is None:
            return {n: 0 for n in self.names}
        if not isinstance(start, Mapping) or start.get("shardsmith") != MIX_STATE:
            raise UsageError("mix: start= takes what Mixture.state(n) returned")
        if not same(start.get("seed"), self.seed) or not same(start.get("shuffle"), self.shuffle):
            raise UsageError(f"mix: start= was saved with seed={start.get('seed')!r} shuffle={start.get('shuffle')!r}; "
                             f"a continued mixture keeps them")
        consumed, lengths = _counts(start.get("consumed"), "consumed"), _counts(start.get("lengths"), "lengths")
        for n in self.names:
            if n in lengths and lengths[n] != self.lengths[n]:
                raise UsageError(f"mix: source {n!r} had {lengths[n]} samples when the state was saved, now "
                                 f"{self.lengths[n]}: its order would differ")
        self._carried = {n: (consumed[n], lengths.get(n)) for n in consumed if n not in self.names}
        return {n: consumed.get(n, 0) for n in self.names}

    def _no_repeats(self) -> int:
        """The default length: the longest prefix in which no source starts a second pass."""
        room = {n: self.lengths[n] - self.consumed[n] for n in self.names}
        slack = self.deviation_bound + 1  # counts(n) >= F(n) - deviation_bound, F(n) >= share·(n - last point)
        last = self.schedule.at[-1] if self.ramps else 0
        final = dict(zip(self.names, self._interleave.shares_at(last))) if self.ramps else self.weights
        lo, hi = 0, last + int(min((max(room[n], 0) + slack) / final[n] for n in self.names if final[n] > 0)) + 1
        while lo < hi:  # counts are monotone in n
            mid = (lo + hi + 1) // 2
            counts = self.counts(mid)
            lo, hi = (mid, hi) if all(counts[n] <= room[n] for n in self.names) else (lo, mid - 1)
        return lo

    def __len__(self) -> int:
        return self._len

    def counts(self, n: int) -> dict[str, int]:
        """How many of the first n samples come from each source."""
        return dict(zip(self.names, self._interleave.counts(int(n)).tolist()))

    def shares_at(self, n: int) -> dict[str, float]:
        """Each source's scheduled share at sample n (fixed weights: ``weights``)."""
        if not self.ramps:
            return dict(self.weights)
        return dict(zip(self.names, self._interleave.shares_at(n).tolist()))

    def report(self, n: int | None = None) -> dict[str, Any]:
        """After the first n samples (all, by default): each source's share there, samples, draws
        (``drawn``, counting a ``start=`` state's) and passes (``epochs``), plain ints and floats."""
        n = self._len if n is None else int(n)
        if not 0 <= n <= self._len:
            raise ValueError(f"report({n}): the mixture has {self._len} samples")
        counts, shares = self.counts(n), self.shares_at(n)
        return {"position": n, "sources": {name: {
            "share": shares[name], "samples": self.lengths[name], "drawn": self.consumed[name] + counts[name],
            "epochs": (self.consumed[name] + counts[name]) / self.lengths[name]} for name in self.names}}

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """(source number, sample index inside that source) of mixture samples ``indices``. Batches
        come in order, so a run of positions is located ``ahead`` at a time and kept: numpy's cost
        per call, not per sample, was most of a batch of 256 (the same places either way)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        lo, n = (int(idx[0]), idx.size) if idx.size else (0, 0)
        run = n and lo >= 0 and lo + n <= self._len and int(idx[-1]) == lo + n - 1
        # a run of positions, or one position right after the last run (reading in order): located ahead;
        # a lone position (``m[i]``, ``source_of``) alone
        after, self._after = self._after, (lo + n if run else -1)
        if run and ((n == 1 and lo == after) or (n > 1 and (np.diff(idx) == 1).all())):
            got = self._ahead
            if got is None or not got[0] <= lo or lo + n > got[0] + len(got[1]):
                hi = min(self._len, lo + max(self.ahead, n))
                sources, samples = self._located(np.arange(lo, hi, dtype=np.int64))
                sources.flags.writeable = samples.flags.writeable = False  # handed out as views
                got = self._ahead = (lo, sources, samples)
            a = lo - got[0]
            return got[1][a:a + n], got[2][a:a + n]
        if n and (idx.min() < -self._len or idx.max() >= self._len):
            raise IndexError(f"mixture index out of range for {self._len} samples")
        return self._located(np.where(idx < 0, idx + self._len, idx))

    def _located(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        source, draw = self._interleave.locate(idx)
        return source, self._sample(source, draw)

    def _sample(self, source: np.ndarray, draw: np.ndarray) -> np.ndarray:
        """Draw number -> sample index, in each source's own shuffled passes (one source at a time:
        its length, and the key of each of its passes, are scalars there)."""
        out = np.empty_like(draw)
        for s, name in enumerate(self.names):
            rows = np.flatnonzero(source == s)
            if not rows.size:
                continue
            n = self.lengths[name]
            passes, p = np.divmod(draw[rows] + self.consumed[name], n)
            if not self.shuffle:
                out[rows] = p
                continue
            first = int(passes[0])
            single = bool((passes == first).all())  # a pass boundary inside a run is rare
            for q in [first] if single else np.unique(passes).tolist():
                at = slice(None) if single else passes == q
                key = self._keys[s] ^ mix64(np.uint64(q + 1))
                out[rows[at]] = _permute_run(p[at], n, key)
        return out

    def source_of(self, i: int) -> str:
        """The name of the source that sample i comes from."""
        source, _ = self.locate([i])
        return self.names[int(source[0])]

    def __getitem__(self, i: int) -> Any:
        source, sample = self.locate([i])
        return self.sources[self.names[int(source[0])]][int(sample[0])]

    @property
    def kind(self) -> SampleKind:
        """Its sources' kind (they share it: ``mix`` checks)."""
        return self._kind

    def read(self, indices: Any) -> Any:
        """Samples ``indices`` as one batch of the sources' kind: one read per source touched, joined
        by the kind's form (token windows gather straight into one batch)."""
        source, sample = self.locate(indices)
        order = np.argsort(source, kind="stable")  # each source's rows, in the asked order
        ends = np.cumsum(np.bincount(source, minlength=len(self.names))).tolist()
        groups = [(self.sources[self.names[s]], sample[rows], rows)
                  for s, (a, b) in enumerate(zip([0, *ends[:-1]], ends)) if b > a for rows in [order[a:b]]]
        if not groups:
            return self.sources[self.names[0]].read(np.zeros(0, np.int64))
        return self._kind.form.gather(groups, len(source))

    get_batch = read

    def __getitems__(self, indices: list[int]) -> Any:
        return self.read(indices)

    def iter(self, *, shuffle: bool = False, seed: int | None = None, epoch: int = 0, rank: int = 0,
             world_size: int = 1, batch_size: int | None = None, drop_last: bool = False,
             start: int | Mapping[str, Any] | None = None, **checks: Any) -> Any:
        """The mixture on the loader's pipeline, by default as ``MixBatches`` reads it: in order (every
        prefix keeps the weights), under the mixture's seed, so their states are one; ``shuffle=True``
        reads it as any dataset (a permutation of its positions for ``seed`` and ``epoch``)."""
        return super().iter(shuffle=shuffle, seed=self.seed if seed is None else seed, epoch=epoch, rank=rank,
                            world_size=world_size, batch_size=batch_size, drop_last=drop_last, start=start,
                            **checks)

    def origin(self, i: int) -> tuple[str, str]:
        """Sample i's shard and key in its source (``Dataset.origin``), the source named."""
        source, sample = self.locate(np.array([i], dtype=np.int64))
        name = self.names[int(source[0])]
        shard, key = self.sources[name].origin(int(sample[0]))
        return shard, f"{key} (source {name!r})"

    def state(self, n: int) -> dict[str, Any]:
        """What ``start=`` needs to continue after the first n samples (plain ints and strings)."""
        if not 0 <= n <= self._len:
            raise ValueError(f"state({n}): the mixture has {self._len} samples")
        counts = self.counts(n)
        consumed = {name: c for name, (c, _) in self._carried.items()}
        lengths = {name: ln for name, (_, ln) in self._carried.items() if ln is not None}
        consumed.update({name: self.consumed[name] + counts[name] for name in self.names})
        lengths.update(self.lengths)
        epochs = {name: consumed[name] / lengths[name] for name in consumed if lengths.get(name)}
        return {"shardsmith": MIX_STATE, "seed": self.seed, "shuffle": self.shuffle, "consumed": consumed,
                "lengths": lengths, "epochs": epochs}

    @property
    def fingerprint(self) -> str:
        """Names the mixture (weights or schedule, lengths, seed, start) in a loader's state: one of
        another mixture is refused (fixed weights: named as before schedules existed)."""
        named: list[Any] = [self.names, self.weights, self.lengths, self.consumed, self.seed, self.shuffle]
        if self.ramps:
            named.append({"at": self._interleave.at, "shares": self._interleave.shares, "q": self._interleave.q})
        text = json.dumps(named, sort_keys=True)
        return "mix:" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def mix(sources: Mapping[str, Any], weights: Mapping[str, float] | Schedule, *, seed: int,
        num_samples: int | None = None, shuffle: bool = True, start: Mapping[str, Any] | None = None,
        exhausted: str = "repeat") -> Mixture:
    """A weighted mixture of datasets of one kind of sample (``Mixture``).

    ``weights``: positive, normalised here; or a ``Schedule`` (weights at points of the sample
    index, shares linear between them: up to four sources). ``num_samples``: the mixture's length;
    by default the longest prefix in which no source repeats. ``exhausted``: past that, ``"repeat"``
    (small sources cycle, each pass in a new shuffled order; ``m.cycling`` names them and a warning
    says so) or ``"stop"`` (the mixture ends there, whatever ``num_samples``). ``start``:
    ``m.state(n)`` of an earlier mixture with the same seed: each source continues after the draws
    it had, whatever the new weights (a schedule's points count from this mixture's sample 0).
    """
    return Mixture(sources, weights, seed=seed, num_samples=num_samples, shuffle=shuffle, start=start,
                   exhausted=exhausted)
