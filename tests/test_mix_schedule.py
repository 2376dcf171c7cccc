"""Mixture schedules (issue 44, item 4): weights that change over training. Every prefix within 1
of each source's scheduled count (the integral of its share), random access at any position,
fixed mixtures unchanged, exact and elastic resume across a point of the schedule, the policy of
a source that runs out on every road, draws and passes in the state and the report, the recipe."""

from __future__ import annotations

import hashlib
import json
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.errors import UsageError
from shardsmith.kit.rank_split import global_position
from shardsmith.loader import Schedule, mix
from tests.test_mix import sources


def quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mix(*args, **kwargs)


def scheduled(at: list[int], weights: dict[str, list[float]], n: int) -> list[list[Fraction]]:
    """The reference: each source's scheduled count after 0..n samples, exactly. Shares are the
    weights normalised at each point, linear between points, constant after the last; sample t's
    part of the integral is the share at t + 1/2 (exact for a linear piece between integer points)."""
    names = list(weights)
    points = []
    for k in range(len(at)):
        row = [Fraction(repr(float(weights[s][k]))) for s in names]
        points.append([w / sum(row) for w in row])
    out, total = [[Fraction(0)] * len(names)], [Fraction(0)] * len(names)
    for t in range(n):
        k = max(j for j in range(len(at)) if at[j] <= t)
        mid = Fraction(2 * t + 1, 2)
        frac = (mid - at[k]) / (at[k + 1] - at[k]) if k + 1 < len(at) else 0
        ahead = points[k + 1] if k + 1 < len(at) else points[k]
        total = [f + a + frac * (b - a) for f, a, b in zip(total, points[k], ahead)]
        out.append(total)
    return out


decimal = st.integers(0, 20).map(lambda x: x / 10)  # weights as written in recipes: exact shares


@st.composite
def schedules(draw, *, most: int = 500):
    k = draw(st.integers(2, 4))
    at = [0, *sorted(draw(st.sets(st.integers(1, most), max_size=3)))]
    weights = {f"s{s}": [draw(decimal) for _ in at] for s in range(k)}
    for j in range(len(at)):  # at each point some source is drawn, and every source at some point
        if not any(weights[n][j] for n in weights):
            weights["s0"][j] = 1.0
    for n in weights:
        if not any(weights[n]):
            weights[n][draw(st.integers(0, len(at) - 1))] = 0.5
    return at, weights


@settings(max_examples=40, deadline=None)
@given(plan=schedules(most=300), n=st.integers(0, 400), seed=st.integers(0, 2**32))
def test_every_prefix_is_within_one_of_the_scheduled_count(plan, n, seed):
    at, weights = plan
    m = quiet(sources([9] * len(weights)), Schedule(at=at, weights=weights), seed=seed, num_samples=n, shuffle=False)
    source, _ = m.locate(np.arange(n))
    counts = np.zeros(len(weights), dtype=np.int64)
    target = scheduled(at, weights, n)
    for i in range(n + 1):
        assert all(abs(counts[s] - target[i][s]) <= 1 for s in range(len(weights))), (i, counts, target[i])
        if i < n:
            counts[source[i]] += 1
    assert m.deviation_bound <= 1 and [m.counts(n)[s] for s in m.names] == counts.tolist()


@settings(max_examples=40, deadline=None)
@given(w=st.lists(st.lists(st.floats(0, 1e3), min_size=3, max_size=3), min_size=2, max_size=4),
       gaps=st.lists(st.integers(1, 10**12), min_size=3, max_size=3), far=st.integers(0, 4 * 10**12),
       k=st.integers(2, 4))
def test_far_positions_are_located_where_the_counts_say(w, gaps, far, k):
    """Any weights (rounded shares), points up to 10**12 apart, positions up to 4·10**12: the
    samples of a run are each its source's next draw, and the counts stay within 1 of the integral."""
    rows = (w + [[1.0] * 3] * k)[:k]
    weights = {f"s{s}": [max(x, 0.01) if s == 0 else x for x in row] for s, row in enumerate(rows)}
    weights = {n: row if any(row) else [0.0, 0.0, 0.5] for n, row in weights.items()}
    at = [0, gaps[0], gaps[0] + gaps[1]]
    m = quiet(sources([5] * k), Schedule(at=at, weights=weights), seed=0, num_samples=far + 64)
    il = m._interleave
    before = il.counts(far)
    src, draw = il.locate(far + np.arange(64))
    for s, d in zip(src.tolist(), draw.tolist()):
        assert d == before[s]
        before[s] += 1
    assert (before == il.counts(far + 64)).all() and before.sum() == far + 64
    if not m.ramps:
        return
    # the integral of the interleave's own (integer) shares at far: within 1
    q, shares, x = il.q, il.shares, il.at
    seg = max(j for j in range(len(x)) if x[j] <= far)
    for s in range(k):
        f = sum(Fraction(shares[j][s] + shares[j + 1][s], 2 * q) * (x[j + 1] - x[j]) for j in range(seg))
        d = far - x[seg]
        slope = Fraction(shares[seg + 1][s] - shares[seg][s], x[seg + 1] - x[seg]) if seg + 1 < len(x) else 0
        f += Fraction(shares[seg][s], q) * d + slope * d * d / (2 * q)
        assert abs(il.counts(far)[s] - f) <= 1


def _nodes(node):
    return [] if isinstance(node, int) else [node, *_nodes(node.rounded), *_nodes(node.other)]


@settings(max_examples=60, deadline=None)
@given(k=st.integers(2, 4), at=st.sets(st.integers(1, 10**10), min_size=1, max_size=3), data=st.data(),
       lo=st.one_of(st.integers(0, 300), st.integers(0, 10**11)), span=st.integers(1, 400))
def test_the_float_estimate_is_the_exact_count(k, at, data, lo, span):
    """``_taken_at`` (float64 first, exact near a rounding edge) gives ``_taken``'s integers, for
    decimal weights (many exact ties) and any floats alike, in every node."""
    at = [0, *sorted(at)]
    weight = st.one_of(decimal, st.floats(0, 100))
    weights = {f"s{s}": [data.draw(weight) for _ in at] for s in range(k)}
    weights = {n: [max(x, 0.01) if n == "s0" else x for x in row] for n, row in weights.items()}
    weights = {n: row if any(row) else [0.5] * len(at) for n, row in weights.items()}
    schedule = Schedule(at=at, weights=weights)
    if not schedule.ramps(list(weights)):
        return
    il = schedule.interleave(list(weights))
    m = np.arange(lo, lo + span, dtype=np.int64)
    for node in _nodes(il._root):
        assert il._taken_at(node, m).tolist() == [il._taken(node, v) for v in m.tolist()]


# fixed weights: the places, lengths and fingerprints of 8ac82ac (before schedules), and a mixture
# continued from a state with other weights
PINNED = [([300, 200], [0.7, 0.3], 2, 900, True,
           (900, "d9118b80bf9ca9e3", "mix:3389af29a54e5bbe", 900, "ed43b8104b4acf81", "mix:b1092d6579d89963")),
          ([50, 60, 70, 80], [1, 2, 3, 4], 5, 700, True,
           (700, "f3d3e907b3569364", "mix:d415acc183ae0f5b", 700, "0cfb6b56e3757c8b", "mix:44316af4a6bdaa8f")),
          ([40] * 6, [0.3, 0.2, 0.2, 0.15, 0.1, 0.05], 6, 500, True,
           (500, "9b81497f8cd4469a", "mix:aa456e37dbffb19b", 500, "b3928bdeebe36331", "mix:39487be4289f1ec6")),
          ([99, 13, 57], [0.5, 0.25, 0.25], 7, None, False,
           (53, "45782bd67d4a3ebe", "mix:770f84a5b4b1bf94", 27, "05cd1f82de6d46c6", "mix:c4c8773be81a0556")),
          ([1000] * 8, [0.31, 0.0123, 0.2, 0.05, 0.1, 0.07, 0.11, 0.3], 8, 4000, True,
           (4000, "0b3c5a54dbd147f9", "mix:95776789263c1de0", 4000, "bc943060ab99c7d6", "mix:7fdc9be750ef9ead"))]


def _digest(m) -> str:
    s, p = m.locate(np.arange(len(m)))
    return hashlib.sha256(s.astype("<i8").tobytes() + p.astype("<i8").tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("lengths, w, seed, n, shuffle, pinned", PINNED)
def test_fixed_weights_give_the_samples_they_gave_before_schedules(lengths, w, seed, n, shuffle, pinned):
    src = sources(lengths)
    weights = {f"s{k}": x for k, x in enumerate(w)}
    for as_given in (weights, Schedule.fixed(weights), Schedule(at=[0, 50, 10**9], weights={  # shares never change
            name: [x, 2 * x, 4 * x] for name, x in weights.items()})):
        m = quiet(src, as_given, seed=seed, num_samples=n, shuffle=shuffle)
        m2 = quiet(src, dict(zip(weights, reversed(w))), seed=seed, num_samples=n, shuffle=shuffle,
                   start=m.state(len(m) // 2))
        assert (len(m), _digest(m), m.fingerprint, len(m2), _digest(m2), m2.fingerprint) == pinned
        assert not m.ramps and m.deviation_bound < 1


RAMP = Schedule(at=[0, 40, 80], weights={"a": [0.9, 0.1, 0.5], "b": [0.1, 0.9, 0.2], "c": [0, 0, 0.3]})


def test_a_schedule_is_a_mixture_of_its_own():
    m = quiet(sources([50, 60, 30]), Schedule(at=RAMP.at, weights=dict(zip(["s0", "s1", "s2"], RAMP.weights.values()))),
              seed=1, num_samples=160)
    assert m.ramps and m.weights == {"s0": 0.9, "s1": 0.1, "s2": 0.0}
    assert m.shares_at(60) == pytest.approx({"s0": 0.3, "s1": 0.55, "s2": 0.15})  # halfway from 40 to 80
    assert m.shares_at(500) == pytest.approx({"s0": 0.5, "s1": 0.2, "s2": 0.3})
    assert m.counts(40) == {"s0": 20, "s1": 20, "s2": 0}  # the integral of 0.9 -> 0.1 over 40 samples
    assert m.fingerprint != quiet(sources([50, 60, 30]), {"s0": 9, "s1": 1, "s2": 1}, seed=1, num_samples=160).fingerprint
    got = m.get_batch(np.arange(160))
    drawn = [s for s, _ in got]
    assert got == [m[i] for i in range(160)] and drawn[:40].count("s2") == 0 and drawn[:80].count("s2") == 6


def _ramp_mix(tmp_path_factory=None, *, n: int = 120, exhausted: str = "repeat"):
    import shardsmith
    from tests.test_torch_resume import token_dataset

    root = tmp_path_factory.mktemp("sched")
    parts = {name: shardsmith.TokenDataset(token_dataset(root / name, windows=w)) for name, w in
             [("a", 70), ("b", 50), ("c", 20)]}
    return parts, quiet(parts, RAMP, seed=3, num_samples=n, exhausted=exhausted)


@pytest.fixture(scope="module")
def ramp_mix(tmp_path_factory):
    return _ramp_mix(tmp_path_factory)


def _rows(batches) -> list[list[int]]:
    return [row.tolist() for x, _ in batches for row in np.asarray(x)]


@pytest.mark.parametrize("cut", [4, 9, 10, 19])  # batches of 4: the points at 40 and 80 are batches 10 and 20
def test_resume_across_a_point_of_the_schedule_is_exact(ramp_mix, cut):
    parts, m = ramp_mix
    whole = list(m.iter(batch_size=4))
    it = m.iter(batch_size=4)
    head = [next(it) for _ in range(cut)]
    state = json.loads(json.dumps(it.state_dict()))
    again = m.iter(batch_size=4)
    again.load_state_dict(state)
    assert _rows(head + list(again)) == _rows(whole)
    # elastic: two ranks took `cut` batches each; three ranks continue from the global position
    states = []
    for rank in range(2):
        r = m.iter(batch_size=4, rank=rank, world_size=2)
        for _ in range(cut // 2):
            next(r)
        states.append(json.loads(json.dumps(r.state_dict())))
    pos = global_position(states)
    assert pos["position"] == (cut // 2) * 2 * 4
    rest = [m.iter(batch_size=4, rank=rank, world_size=3, start=pos) for rank in range(3)]
    dealt = sorted(row for r in rest for row in _rows(r))
    end = len(m) - (len(m) - pos["position"]) % 12 % 3  # a short batch each, the last rest % 3 dropped (EpochLayout)
    want = sorted(_rows([m.get_batch(np.arange(pos["position"], end))]))  # every sample after it, once
    assert dealt == want


torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated", "ignore:This DataLoader will create")
def test_the_torch_adapter_resumes_a_schedule_as_ds_iter_does(ramp_mix):
    """MixBatches in a StatefulDataLoader with two workers: the batches of m.iter, and a state saved
    before the point at 40 resumes past it into the same batches."""
    from shardsmith.torch import MixBatches

    parts, m = ramp_mix
    want = _rows(m.iter(batch_size=4, drop_last=True))

    def loader():
        return stateful.StatefulDataLoader(MixBatches(m, batch_size=4), batch_size=None, num_workers=2)

    dl = loader()
    it = iter(dl)
    head = [next(it) for _ in range(7)]
    state = dl.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert _rows(head + list(resumed)) == want


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated", "ignore:This DataLoader will create")
def test_a_source_that_runs_out_stops_or_repeats_alike_on_every_road(tmp_path_factory):
    from shardsmith.torch import MixBatches

    parts, stop = _ramp_mix(tmp_path_factory, n=10_000, exhausted="stop")
    drawn = stop.report()["sources"]
    assert len(stop) < 10_000 and not stop.cycling and max(s["drawn"] - s["samples"] for s in drawn.values()) == 0
    assert [s["drawn"] for s in quiet(parts, RAMP, seed=3, num_samples=len(stop) + 1).report()["sources"].values()] \
        != [s["drawn"] for s in drawn.values()]  # one more sample would start a second pass
    with pytest.warns(UserWarning, match="new shuffled pass"):
        repeat = mix(parts, RAMP, seed=3, num_samples=len(stop) + 40)
    assert repeat.cycling and repeat.get_batch(np.arange(len(stop)))[0].tolist() == \
        stop.get_batch(np.arange(len(stop)))[0].tolist()
    for m in (stop, repeat):
        roads = [_rows(m.iter(batch_size=8, drop_last=True)), _rows(MixBatches(m, batch_size=8)),
                 _rows(stateful.StatefulDataLoader(MixBatches(m, batch_size=8), batch_size=None))]
        assert roads[0] == roads[1] == roads[2] and len(roads[0]) == len(m) // 8 * 8


def test_the_state_and_the_report_hold_draws_and_passes(ramp_mix):
    parts, m = ramp_mix
    state = json.loads(json.dumps(m.state(100)))
    report = m.report(100)
    assert report["position"] == 100 and sum(s["drawn"] for s in report["sources"].values()) == 100
    for name, s in report["sources"].items():
        assert s["drawn"] == state["consumed"][name] == m.counts(100)[name]
        assert s["epochs"] == state["epochs"][name] == s["drawn"] / len(parts[name])
    assert report["sources"]["c"]["share"] == pytest.approx(0.3) and m.report(60)["sources"]["c"]["share"] == \
        pytest.approx(0.15)  # after the last point; halfway from 0 to 0.3
    follow = quiet(parts, {"a": 1, "b": 1, "c": 1}, seed=3, num_samples=30, start=state)
    assert {n: s["drawn"] for n, s in follow.report(0)["sources"].items()} == state["consumed"]
    with pytest.raises(ValueError, match="121"):
        m.report(121)


@pytest.mark.parametrize("kwargs, match", [
    ({"at": [1, 5], "weights": {"s0": 1, "s1": 1}}, "start at 0 and increase"),
    ({"at": [0, 5, 5], "weights": {"s0": 1, "s1": 1}}, "start at 0 and increase"),
    ({"at": [0, "5"], "weights": {"s0": 1, "s1": 1}}, "sample positions"),
    ({"at": [0, 5], "weights": {"s0": [1, 2, 3], "s1": 1}}, "3 weights for 2 points"),
    ({"at": [0, 5], "weights": {"s0": [1, -1], "s1": 1}}, "numbers >= 0"),
    ({"at": [0, 5], "weights": {"s0": [0, 0], "s1": 1}}, "never be drawn"),
    ({"at": [0, 5], "weights": {"s0": [0, 1], "s1": [1, 0]}}, None),
    ({"at": [0, 5], "weights": {"s0": [0, 1], "s1": [0, 1]}}, "every weight is 0 at sample 0"),
])
def test_bad_schedules_are_one_line_errors(kwargs, match):
    if match is None:
        Schedule(**kwargs)
        return
    with pytest.raises(UsageError, match=match) as err:
        Schedule(**kwargs)
    assert "\n" not in str(err.value)


def test_a_schedule_names_the_sources_and_ramps_up_to_four():
    with pytest.raises(UsageError, match=r"without a weight: \['s2'\]"):
        mix(sources([5, 5, 5]), Schedule(at=[0, 9], weights={"s0": [1, 2], "s1": 1}), seed=0)
    five = {f"s{k}": [1, 1 + k] for k in range(5)}
    with pytest.raises(UsageError, match="up to 4 sources"):
        mix(sources([5] * 5), Schedule(at=[0, 9], weights=five), seed=0)
    steady = quiet(sources([5] * 5), Schedule(at=[0, 9], weights={n: [1, 2] for n in five}), seed=0)  # no ramp
    assert not steady.ramps and steady.weights == {n: 0.2 for n in five}
    with pytest.raises(UsageError, match="'repeat'"):
        mix(sources([5, 5]), {"s0": 1, "s1": 1}, seed=0, exhausted="never")


def test_points_in_tokens_for_sources_of_a_fixed_seq_len(ramp_mix, tmp_path):
    """Token windows of 16 tokens: point 640 tokens is sample 40; a point between samples, or
    documents (no fixed number of tokens), are one-line errors."""
    import shardsmith
    from tests.test_torch_resume import token_dataset

    parts, m = ramp_mix
    seq_len = dict(parts["a"].kind.traits)["seq_len"]
    tokens = Schedule(at=[x * seq_len for x in RAMP.at], weights=RAMP.weights, unit="tokens")
    again = quiet(parts, tokens, seed=3, num_samples=len(m))
    assert again.schedule.at == RAMP.at and again.fingerprint == m.fingerprint
    with pytest.raises(UsageError, match=f"point 641 tokens is not a whole number of samples of {seq_len} tokens"):
        mix(parts, Schedule(at=[0, 641], weights={"a": [1, 2], "b": 1, "c": 1}, unit="tokens"), seed=0)
    docs = {n: shardsmith.loader.TokenDocuments(token_dataset(tmp_path / n, windows=20)) for n in ("x", "y")}
    with pytest.raises(UsageError, match="fixed number of tokens per sample"):
        mix(docs, Schedule(at=[0, 64], weights={"x": [1, 2], "y": 1}, unit="tokens"), seed=0)
    with pytest.raises(UsageError, match="'samples' or 'tokens'"):
        Schedule(at=[0], weights={"x": 1}, unit="bytes")


# -- the recipe ------------------------------------------------------------------------------------------

def test_a_recipe_schedules_weights(tmp_path, monkeypatch):
    import shardsmith
    from shardsmith.loader.mix_recipe import from_recipe
    from tests.conftest import run_cli
    from tests.test_torch_resume import token_dataset

    monkeypatch.chdir(tmp_path)
    for name, windows in [("web", 60), ("code", 30)]:
        token_dataset(tmp_path / name, windows=windows, seq_len=16, vocab=64)
    (tmp_path / "mix.toml").write_text(
        '[mix]\nseed = 4\nnum_samples = 80\nschedule = [0, 640]\nschedule_unit = "tokens"\nexhausted = "stop"\n'
        '[mix.sources.web]\npath = "web"\nweight = [0.8, 0.5]\nloader = "TokenDataset"\nseq_len = 16\n'
        '[mix.sources.code]\npath = "code"\nweight = [0.2, 0.5]\nloader = "TokenDataset"\nseq_len = 16\n')
    m = from_recipe("mix.toml")
    parts = {n: shardsmith.TokenDataset(n, seq_len=16) for n in ("web", "code")}
    want = mix(parts, Schedule(at=[0, 40], weights={"web": [0.8, 0.5], "code": [0.2, 0.5]}), seed=4, num_samples=80,
               exhausted="stop")
    assert m.ramps and m.exhausted == "stop" and m.fingerprint == want.fingerprint
    assert m.get_batch(np.arange(len(m)))[0].tolist() == want.get_batch(np.arange(len(want)))[0].tolist()
    res = run_cli("run", "mix.toml")
    assert res.exit_code == 0, res.stderr
    assert "schedule: shares at samples 0, 40" in res.output and "weight 0.800 -> 0.500" in res.output, res.output
    (tmp_path / "bad.toml").write_text(
        '[mix]\nschedule = [0, 40]\n[mix.sources.web]\npath = "web"\nweight = [0.8]\n')
    res = run_cli("run", "bad.toml")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().endswith("[mix.sources.web] weight: 1 weights for the 2 points of schedule"), res.stderr
