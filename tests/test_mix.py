"""Weighted mixtures (shardsmith.loader.mix): the ±1 property at every prefix, determinism, each
source's own shuffled passes, weight changes at a resume point, and the torch adapter's exact
resume through StatefulDataLoader (docs/design.md, "Loader")."""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsmith
from shardsmith.errors import UsageError
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.sample_kind import ListForm, SampleKind
from shardsmith.loader import mix
from shardsmith.loader.mixture import _GOLD, _MUL, _permute_run
from tests.test_torch_resume import token_dataset


def _round(x: np.ndarray, key: np.ndarray) -> np.ndarray:
    """The reference (the vectorised form ``_permute_run`` replaced): one Feistel round's mixing of a half and its key (multiply-xorshift, wrapping uint64)."""
    h = (x ^ key) * _GOLD
    h ^= h >> np.uint64(29)
    h *= _MUL
    return h ^ (h >> np.uint64(32))


def _permute(p: np.ndarray, n: Any, keys: np.ndarray) -> np.ndarray:
    """Position p of a keyed pseudo-random permutation of range(n) (n: one per element, >= 1): an
    unbalanced 4-round Feistel network on the bits of n - 1 (a domain under 2n), walking each
    cycle back into range(n). Vectorised over elements of different sources and passes at once."""
    n = np.broadcast_to(np.asarray(n, dtype=np.uint64), p.shape)
    bits = np.frexp((n - np.uint64(1)).astype(np.float64))[1].astype(np.uint64)  # bit length (n < 2**53)
    one = np.uint64(1)
    a, b = bits // np.uint64(2), bits - bits // np.uint64(2)  # halves swap sizes each round; 4 rounds restore
    keys = [keys + np.uint64(r * 0x9E3779B97F4A7C15 % 2**64) for r in range(1, 5)]

    def feistel(x: np.ndarray, sel: Any) -> np.ndarray:
        top, low = a[sel], b[sel]
        hi, lo = x >> low, x & ((one << low) - one)
        for k in keys:  # (hi: top bits, lo: low bits) -> (lo, hi ^ F(lo) masked to top bits)
            hi, lo, top, low = lo, hi ^ (_round(lo, k[sel]) & ((one << top) - one)), low, top
        return (hi << low) | lo

    y = feistel(p.astype(np.uint64), slice(None))
    out = np.flatnonzero(y >= n)
    while out.size:  # walk the cycle back into range(n): a bijection stays a bijection
        y[out] = feistel(y[out], out)
        out = out[y[out] >= n[out]]
    return y.astype(np.int64)



class Ids(Dataset):
    """A stand-in source of the loader's protocol: sample i is (name, i), so a mixture's samples say
    where they came from."""

    kind = SampleKind("ids", ListForm())

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[str, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.name, int(i)

    def read(self, indices) -> list[tuple[str, int]]:
        return [self[int(i)] for i in np.asarray(indices)]


def sources(lengths: list[int]) -> dict[str, Ids]:
    return {f"s{k}": Ids(f"s{k}", n) for k, n in enumerate(lengths)}


weights_st = st.lists(st.floats(1e-4, 1e4, allow_nan=False), min_size=1, max_size=4)


def quiet_mix(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mix(*args, **kwargs)


@settings(max_examples=200, deadline=None)
@given(w=weights_st, n=st.integers(0, 3000), seed=st.integers(0, 2**32))
def test_every_prefix_holds_each_source_within_one(w, n, seed):
    m = quiet_mix(sources([7] * len(w)), {f"s{k}": x for k, x in enumerate(w)}, seed=seed, num_samples=n)
    source, _ = m.locate(np.arange(n))
    share = np.array([m.weights[name] for name in m.names])
    counts = np.cumsum(np.eye(len(w), dtype=np.int64)[source], axis=0) if n else np.zeros((0, len(w)))
    deviation = np.abs(counts - np.arange(1, n + 1)[:, None] * share)
    assert deviation.max(initial=0) <= 1 and m.deviation_bound < 1
    for prefix in {0, n // 3, n}:  # counts(n) is the closed form of the same prefix
        expect = counts[prefix - 1] if prefix else np.zeros(len(w))
        assert [m.counts(prefix)[name] for name in m.names] == expect.tolist()


@settings(max_examples=40, deadline=None)
@given(w=st.lists(st.floats(1e-4, 1e4, allow_nan=False), min_size=5, max_size=12), n=st.integers(0, 3000),
       far=st.integers(0, 10**12), seed=st.integers(0, 2**32))
def test_many_sources_hold_every_prefix_within_one(w, n, far, seed):
    """Five sources or more: one period of a quota schedule (loader/interleave.py), any weights."""
    m = quiet_mix(sources([7] * len(w)), {f"s{k}": x for k, x in enumerate(w)}, seed=seed, num_samples=n)
    share = np.array([m.weights[name] for name in m.names])
    assert abs(share.sum() - 1) < 1e-12 and np.abs(share - np.array(w) / sum(w)).max() <= len(w) * 2 ** -16
    source, _ = m.locate(np.arange(n))
    counts = np.cumsum(np.eye(len(w), dtype=np.int64)[source], axis=0) if n else np.zeros((0, len(w)))
    assert np.abs(counts - np.arange(1, n + 1)[:, None] * share).max(initial=0) < 1 and m.deviation_bound < 1
    for prefix in (far, far + 1, n):  # far prefixes by the closed form; locate agrees with counts
        c = np.array([m.counts(prefix)[name] for name in m.names])
        assert c.sum() == prefix and np.abs(c - prefix * share).max() < 1
    late = far + np.arange(64)
    src, draw = m._interleave.locate(late)
    before = m._interleave.counts(far)
    for s, d in zip(src.tolist(), draw.tolist()):
        assert d == before[s]  # each late sample is its source's next draw
        before[s] += 1
    assert (before == m._interleave.counts(far + 64)).all()


def test_decimal_and_ratio_weights_are_kept_exactly():
    m = quiet_mix(sources([50] * 6), {f"s{k}": x for k, x in enumerate([0.3, 0.2, 0.2, 0.15, 0.1, 0.05])},
                  seed=0, num_samples=5000)
    assert [m.weights[f"s{k}"] for k in range(6)] == [0.3, 0.2, 0.2, 0.15, 0.1, 0.05]
    assert m._interleave.period == 20 and m.counts(20) == {"s0": 6, "s1": 4, "s2": 4, "s3": 3, "s4": 2, "s5": 1}
    thirds = quiet_mix(sources([9] * 6), {f"s{k}": 1 for k in range(6)}, seed=0, num_samples=12)
    assert [thirds.source_of(i) for i in range(12)] == [f"s{k}" for k in range(6)] * 2


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=4), seed=st.integers(0, 1000), data=st.data())
def test_deterministic_and_each_source_cycles_through_shuffled_passes(lengths, seed, data):
    w = {f"s{k}": data.draw(st.floats(0.1, 10)) for k in range(len(lengths))}
    n = data.draw(st.integers(0, 400))
    a = quiet_mix(sources(lengths), w, seed=seed, num_samples=n)
    b = quiet_mix(sources(lengths), w, seed=seed, num_samples=n)
    got = a.get_batch(np.arange(n))
    assert got == b.get_batch(np.arange(n)) == [a[i] for i in range(n)]
    assert [a.source_of(i) for i in range(n)] == [name for name, _ in got]
    for name, length in zip(a.names, lengths):
        drawn = [i for src, i in got if src == name]
        for start in range(0, len(drawn), length):  # every pass is a permutation of the source
            chunk = drawn[start:start + length]
            assert len(set(chunk)) == len(chunk) and set(chunk) <= set(range(length))
            if len(chunk) == length:
                assert sorted(chunk) == list(range(length))
        assert a.epochs[name] == pytest.approx(len(drawn) / length)
        assert (name in a.cycling) == (len(drawn) > length)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=4), seed=st.integers(0, 1000), data=st.data())
def test_runs_located_ahead_are_the_places_located_one_by_one(lengths, seed, data):
    """``locate`` keeps a run of positions located ahead for batches asked in order: whatever runs are
    asked, forwards, backwards or overlapping, each position's place is the one it has alone."""
    w = {f"s{k}": data.draw(st.floats(0.1, 10)) for k in range(len(lengths))}
    n = data.draw(st.integers(1, 300))
    m = quiet_mix(sources(lengths), w, seed=seed, num_samples=n)
    m.ahead = data.draw(st.integers(1, 50))
    alone = [tuple(int(v[0]) for v in m._located(np.array([i]))) for i in range(n)]
    for _ in range(data.draw(st.integers(1, 8))):
        a = data.draw(st.integers(0, n - 1))
        b = data.draw(st.integers(a + 1, n))
        source, sample = m.locate(np.arange(a, b))
        assert list(zip(source.tolist(), sample.tolist())) == alone[a:b]


def test_default_length_repeats_nothing_and_cycling_warns():
    m = mix(sources([100, 30]), {"s0": 1, "s1": 1}, seed=0)
    assert len(m) in (60, 61) and not m.cycling  # s1 runs out first, at 30 of its samples
    assert m.counts(len(m))["s1"] == 30
    with pytest.warns(UserWarning, match=r"\['s1'\].*new shuffled pass"):
        m = mix(sources([100, 30]), {"s0": 1, "s1": 1}, seed=0, num_samples=200)
    assert m.cycling == ["s1"] and m.epochs["s1"] == pytest.approx(100 / 30)


def test_the_cycling_warning_points_at_the_callers_line():
    """Through mix() and through Mixture() alike, the warning names this file, not the library."""
    from shardsmith.loader import Mixture

    for make in (lambda: mix(sources([100, 30]), {"s0": 1, "s1": 1}, seed=0, num_samples=200),
                 lambda: Mixture(sources([100, 30]), {"s0": 1, "s1": 1}, seed=0, num_samples=200, shuffle=True,
                                 start=None)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make()
        assert [w.filename for w in caught] == [__file__], [(w.filename, w.lineno) for w in caught]


def _cycling_recipe(tmp_path):
    """A mix recipe over 100 and 10 windows, drawing 50 of each: `code` cycles (5 passes)."""
    token_dataset(tmp_path / "web", windows=100, seq_len=16, shards=1, vocab=64)
    token_dataset(tmp_path / "code", windows=10, seq_len=16, shards=1, vocab=64)
    recipe = tmp_path / "mix.toml"
    recipe.write_text("[mix]\nseed = 0\nnum_samples = 100\n" + "".join(
        f'[mix.sources.{name}]\npath = "{name}"\nweight = 1\nloader = "TokenDataset"\nseq_len = 16\n'
        for name in ("web", "code")))
    return recipe


def test_a_mix_recipe_gives_seq_len_to_token_windows_only(tmp_path, monkeypatch):
    """seq_len with the default loader (documents) is one line, not open()'s TypeError."""
    from tests.conftest import run_cli

    monkeypatch.chdir(tmp_path)  # a recipe's paths are relative to the working directory
    recipe = _cycling_recipe(tmp_path)
    recipe.write_text(recipe.read_text().replace('loader = "TokenDataset"\n', "", 1))
    res = run_cli("run", recipe)
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().endswith('[mix.sources.web] seq_len is for loader = "TokenDataset" (windows of '
                                       'seq_len tokens); the default loader gives whole documents'), res.stderr


def test_the_cycling_warning_of_a_recipe_points_at_the_callers_line(tmp_path, monkeypatch):
    """from_recipe is one more layer of shardsmith between the caller and Mixture: still this file."""
    from shardsmith.loader.mix_recipe import from_recipe

    monkeypatch.chdir(tmp_path)
    recipe = _cycling_recipe(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = from_recipe(recipe)
    assert m.cycling == ["code"]
    assert [(w.category, w.filename) for w in caught] == [(shardsmith.ShardsmithWarning, __file__)], caught
    assert issubclass(shardsmith.ShardsmithWarning, UserWarning)  # a user's filter on UserWarning still applies
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=shardsmith.ShardsmithWarning)  # shardsmith's alone, silenced
        from_recipe(recipe)
    assert caught == []


def test_the_program_says_the_cycling_warning_as_one_line(tmp_path):
    """`shardsmith run` of a cycling mixture: one `shardsmith: warning:` line, not Python's file:line (click's)
    and source line; under -W error it is still an error (the filters decide, not the program)."""
    import subprocess
    import sys

    recipe = _cycling_recipe(tmp_path)
    res = subprocess.run([sys.executable, "-m", "shardsmith", "run", str(recipe)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "code  weight 0.500" in res.stdout and "(cycles: new shuffled passes)" in res.stdout, res.stdout
    assert res.stderr.splitlines() == ["shardsmith: warning: mix: sources ['code'] run out and start a new shuffled "
                                       "pass (passes: code=5.00)"], res.stderr
    res = subprocess.run([sys.executable, "-W", "error::UserWarning", "-m", "shardsmith", "run", str(recipe)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode != 0 and "ShardsmithWarning: mix: sources ['code']" in res.stderr, res.stderr


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=2, max_size=4), seed=st.integers(0, 99), data=st.data())
def test_new_weights_at_a_resume_point_continue_every_source(lengths, seed, data):
    names = [f"s{k}" for k in range(len(lengths))]
    before = {n: data.draw(st.floats(0.1, 10)) for n in names}
    after = {n: data.draw(st.floats(0.1, 10)) for n in names}
    n1, n2 = data.draw(st.integers(0, 150)), data.draw(st.integers(0, 150))
    first = quiet_mix(sources(lengths), before, seed=seed, num_samples=n1)
    cut = data.draw(st.integers(0, n1))
    state = json.loads(json.dumps(first.state(cut)))
    second = quiet_mix(sources(lengths), after, seed=seed, num_samples=n2, start=state)
    # a mixture that had every source's draws continues each source's own sequence
    long = {n: quiet_mix({n: Ids(n, ln)}, {n: 1}, seed=seed, num_samples=500) for n, ln in zip(names, lengths)}
    seen = first.get_batch(np.arange(cut)) + second.get_batch(np.arange(n2))
    for n in names:
        mine = [i for src, i in seen if src == n]
        assert mine == [i for _, i in long[n].get_batch(np.arange(len(mine)))]
    assert second.state(n2)["consumed"] == {n: first.counts(cut)[n] + second.counts(n2)[n] for n in names}


def test_bad_mixtures_are_one_line_errors(tmp_path):
    s = sources([5, 5])
    for weights, match in [({"s0": 1}, "without a weight"), ({"s0": 1, "s1": 1, "x": 1}, "unknown"),
                           ({"s0": 1, "s1": 0}, "positive"), ({"s0": 1, "s1": float("nan")}, "positive"),
                           ({"s0": 1, "s1": "2"}, "positive")]:
        with pytest.raises(UsageError, match=match) as err:
            mix(s, weights, seed=0)
        assert "\n" not in str(err.value)
    a = shardsmith.TokenDataset(token_dataset(tmp_path / "a", windows=20, seq_len=4))
    b = shardsmith.TokenDataset(token_dataset(tmp_path / "b", windows=20, seq_len=8))
    with pytest.raises(UsageError, match="another kind of sample"):
        mix({"a": a, "b": b}, {"a": 1, "b": 1}, seed=0)
    with pytest.raises(UsageError, match="another kind of sample"):
        mix({"a": a, "ids": Ids("x", 5)}, {"a": 1, "ids": 1}, seed=0)
    other = token_dataset(tmp_path / "other", windows=20, seq_len=4)  # the same ids from another tokenizer
    m = json.loads((other / "manifest.json").read_text())
    m["tokenizer"]["sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UsageError, match="tokenizers"):
        mix({"a": a, "other": shardsmith.TokenDataset(other)}, {"a": 1, "other": 1}, seed=0)
    with pytest.raises(UsageError, match="seed"):
        mix(s, {"s0": 1, "s1": 1}, seed=1, start=mix(s, {"s0": 1, "s1": 1}, seed=0).state(2))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097])
def test_the_shuffle_is_a_permutation(n):
    keys = np.full(n, np.uint64(0xDEADBEEF), dtype=np.uint64)
    assert sorted(_permute(np.arange(n), n, keys).tolist()) == list(range(n))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 2**40), key=st.integers(0, 2**64 - 1), data=st.data())
def test_the_shuffle_of_one_pass_is_the_vectorised_shuffle(n, key, data):
    """``_permute_run`` (a source's pass, scalars) places every position where ``_permute`` does."""
    p = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=50)), dtype=np.int64)
    keys = np.full(len(p), np.uint64(key), dtype=np.uint64)
    assert _permute_run(p, n, np.uint64(key)).tolist() == _permute(p, n, keys).tolist()


def test_a_mixtures_places_are_pinned():
    """The order a seed gives never changes: these places were made before the per-pass shuffle
    and the gather into one batch (three sources, two of them cycling through passes)."""
    m = quiet_mix({"web": Ids("web", 2000), "code": Ids("code", 700), "books": Ids("books", 90)},
                  {"web": 0.5, "code": 0.3, "books": 0.2}, seed=11, num_samples=5000)
    s, p = m.locate(np.arange(5000))
    digest = hashlib.sha256(s.astype("<i8").tobytes() + p.astype("<i8").tobytes()).hexdigest()
    assert digest == "546d3932fa1123065c83a991dde66c8467ea9801563866309508ceaa00229c08"
    rng = np.random.default_rng(0)
    scattered = rng.integers(-5000, 5000, 300)  # not a run: located one by one, negative from the end
    got = m.locate(scattered)
    assert got[0].tolist() == s[scattered].tolist() and got[1].tolist() == p[scattered].tolist()


# -- tokens through the torch adapter ---------------------------------------------------------------

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")


@pytest.fixture(scope="module")
def token_mix(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    parts = {name: shardsmith.TokenDataset(token_dataset(root / name, windows=n)) for name, n in
             [("web", 97), ("code", 41), ("books", 13)]}
    return parts, {"web": 0.5, "code": 0.3, "books": 0.2}


@pytest.mark.parametrize("picks", ["run", "scattered"])
def test_token_batches_match_the_sources(token_mix, picks):
    """Token sources gather into one batch (``fill_windows``): each row is its source's window."""
    parts, weights = token_mix
    m = quiet_mix(parts, weights, seed=3, num_samples=150)
    idx = np.arange(150) if picks == "run" else np.random.default_rng(1).integers(-150, 150, 64)
    x, y = m.get_batch(idx)
    assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (len(idx), parts["web"].seq_len)
    source, sample = m.locate(idx)
    for k in range(len(idx)):
        px, py = parts[m.names[source[k]]][int(sample[k])]
        assert np.array_equal(x[k], px) and np.array_equal(y[k], py)
    assert m.get_batch(np.zeros(0, np.int64))[0].shape == (0, parts["web"].seq_len)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated", "ignore:This DataLoader will create",
                            "ignore:mix. sources")
@settings(max_examples=8, deadline=None)
@given(workers=st.integers(0, 3), batch=st.integers(1, 9), world=st.integers(1, 3), stop=st.floats(0, 1),
       every=st.integers(1, 3), data=st.data())
def test_mix_batches_resume_exactly_through_stateful_dataloader(token_mix, workers, batch, world, stop, every, data):
    from shardsmith.torch import MixBatches, global_position

    parts, weights = token_mix
    m = quiet_mix(parts, weights, seed=3, num_samples=300)
    rank = data.draw(st.integers(0, world - 1))

    def adapter():
        return MixBatches(m, batch_size=batch, rank=rank, world_size=world)

    def loader():
        extra = {"prefetch_factor": 2} if workers else {}
        return stateful.StatefulDataLoader(adapter(), batch_size=None, num_workers=workers,
                                           snapshot_every_n_steps=every, **extra)

    reference = list(adapter())
    dl = loader()
    k = int(stop * len(reference))
    it = iter(dl)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(dl.state_dict()))
    tail = list(it)
    same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(head + tail, reference))
    assert same and len(head + tail) == len(reference)
    resumed = loader()
    resumed.load_state_dict(state)
    again = list(resumed)
    assert len(again) == len(tail) and all(torch.equal(a[0], b[0]) for a, b in zip(again, tail))
    # the consumed prefix turns into a mixture state: new weights continue from there
    position = global_position(state)["position"]
    assert position == k * world * batch
    follow = quiet_mix(parts, {"web": 0.1, "code": 0.1, "books": 0.8}, seed=3, num_samples=10,
                       start=m.state(position))
    assert len(follow.get_batch(np.arange(10))[0]) == 10


# -- the README's example and the mix recipe ----------------------------------------------------------

@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated", "ignore:This DataLoader will create",
                            "ignore:mix. sources")
def test_the_docs_mixture_runs_as_written(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from shardsmith.loader.mix_recipe import from_recipe
    from tests.conftest import run_cli

    readme = (Path(__file__).resolve().parents[1] / "docs" / "loader.md").read_text()
    section = readme[readme.index("### Weighted mixtures"):]
    first = section.index("```python\n") + len("```python\n")
    code = section[first:section.index("```\n", first)]
    at = section.index("```toml\n") + len("```toml\n")
    (tmp_path / "mix.toml").write_text(section[at:section.index("```\n", at)])
    token_dataset(tmp_path / "tour" / "loader" / "web", windows=1000, seq_len=128, vocab=512)
    token_dataset(tmp_path / "tour" / "loader" / "code", windows=200, seq_len=128, vocab=512)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__main__"}
    exec(compile(code, "loader.md", "exec"), scope)
    assert capsys.readouterr().out.split()[:2] == ["400", "web"]
    m, m2 = scope["m"], scope["m2"]
    assert m.cycling == [] and scope["x"].shape == (8, 128)
    assert m2.consumed == m.counts(8) and m.deviation_bound < 1
    res = run_cli("run", "mix.toml", "--set", "code=0.7")  # weights are normalised: 0.7, 0.7
    assert res.exit_code == 0, res.stderr
    assert "mixture of 2 sources: 400 samples" in res.output and "code  weight 0.500" in res.output
    again = from_recipe("mix.toml")
    assert again.get_batch(np.arange(50))[0].tolist() == m.get_batch(np.arange(50))[0].tolist()
    (tmp_path / "bad.toml").write_text('[mix]\nseed = 0\n[mix.sources.web]\npath = "tour/web"\n')
    res = run_cli("run", "bad.toml")
    assert res.exit_code == 2 and "needs path" in res.stderr and "Traceback" not in res.stderr


def test_events_and_tar_samples_mix_in_order(tmp_path):
    import test_hdf5_writer as hw
    import test_tar_loader as tl

    events = [shardsmith.open(hw.write_dataset(tmp_path / f"ev{k}", {"train": hw.make_events(90 + k, seed=k)},
                                               shard_samples=32)) for k in range(2)]
    m = quiet_mix({"a": events[0], "b": events[1]}, {"a": 2, "b": 1}, seed=4, num_samples=60)
    batch = m.get_batch(np.arange(60))
    source, sample = m.locate(np.arange(60))
    for k in range(60):
        want = events[source[k]][int(sample[k])]
        got = batch.event(k)
        assert all(np.array_equal(got[f], want[f]) for f in want)
    tars = [shardsmith.loader.TarDataset(tl.write_dataset(tmp_path / f"t{k}", {"train": tl.make_samples(20, f"t{k}")},
                                                          per_shard=7)) for k in range(2)]
    m = quiet_mix({"x": tars[0], "y": tars[1]}, {"x": 1, "y": 3}, seed=1, num_samples=40)
    keys = [s["__key__"] for s in m.get_batch(np.arange(40))]
    assert keys == [m[i]["__key__"] for i in range(40)]
    assert sum(m.source_of(i) == "y" for i in range(40)) == 30
