"""Class-balanced epochs (issue 16 point 5): per-class counts at every prefix close to the weights,
no repeat within an epoch while a class lasts, determinism, equal batches per rank, exact resume
through StatefulDataLoader and elastic resume (docs/loader.md, "Class balance"; docs/design.md, "Loader")."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.kit.rank_split import global_position
from shardsmith.loader.balance_sampler import BalancedSampler
from shardsmith.loader.balanced_order import BalancedOrder


@st.composite
def labelled(draw):
    counts = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6).filter(lambda c: sum(c) > 0))
    labels = np.repeat(np.arange(len(counts)), counts)
    labels = labels[np.random.default_rng(draw(st.integers(0, 99))).permutation(len(labels))]
    present = [c for c, k in enumerate(counts) if k]
    if draw(st.booleans()):
        weights = "inverse"
        w = np.array([1.0 if k else 0.0 for k in counts])
    else:
        raw = [draw(st.integers(0, 9)) if k else 0 for k in counts]
        if not any(raw):
            raw[present[0]] = 1
        weights, w = raw, np.array(raw, float)
    return labels, weights, w / w.sum()


@settings(max_examples=200, deadline=None)
@given(data=labelled(), n=st.integers(0, 400), seed=st.integers(0, 5), epoch=st.integers(0, 3),
       shuffle=st.booleans())
def test_every_prefix_follows_the_weights_and_no_class_repeats_while_it_lasts(data, n, seed, epoch, shuffle):
    labels, weights, w = data
    order = BalancedOrder(labels, weights)
    assert not w[len(order.counts):].any()  # classes past the largest label: no weight
    w = w[:len(order.counts)]
    idx = order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    assert idx.shape == (n,) and idx.dtype == np.int64
    assert np.array_equal(idx, order(n, shuffle=shuffle, seed=seed, epoch=epoch))  # a pure function
    seq = labels[idx]
    counts = np.cumsum(np.eye(len(w), dtype=np.int64)[seq], axis=0) if n else np.zeros((0, len(w)))
    t = np.arange(1, n + 1)[:, None]
    assert np.all(np.abs(counts - w[None, :] * t) < 1 + 1e-9)  # |count_c - w_c t| <= 1 at every prefix
    members = np.bincount(labels, minlength=len(w))
    report = order.report(n, seed=seed)
    for c in range(len(w)):
        drawn = idx[seq == c]
        m = members[c]
        assert len(drawn) == report.drawn[c] and report.repeated[c] == max(0, len(drawn) - m)
        for p in range(0, len(drawn), max(m, 1)):  # each pass: distinct members of the class
            one = drawn[p:p + m]
            assert len(set(one.tolist())) == len(one)
        if len(drawn) >= m:
            assert sorted(drawn[:m].tolist()) == np.flatnonzero(labels == c).tolist()


def test_epochs_and_seeds_change_the_samples_not_the_class_shares():
    labels = np.repeat([0, 1, 2], [500, 60, 15])
    order = BalancedOrder(labels, {0: 2, 1: 1, 2: 1})
    a, b, c = (order(400, shuffle=True, seed=s, epoch=e) for s, e in ((0, 0), (0, 1), (1, 0)))
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.bincount(labels[a]).tolist() == np.bincount(labels[b]).tolist() == [200, 100, 100]
    report = order.report(400, seed=0).as_dict()
    assert report["2"] == {"drawn": 100, "samples": 15, "repeated": 85}
    assert report["1"]["repeated"] == 40 and report["0"]["repeated"] == 0
    named = BalancedOrder(labels, {"cat": 1.0, "dog": 1.0}, names=["cat", "dog", "eel"])
    assert set(labels[named(50, shuffle=True, seed=0, epoch=0)].tolist()) == {0, 1}
    with pytest.raises(ValueError, match="no samples"):
        BalancedOrder(np.array([0, 0, 2]), [1, 1, 1])
    with pytest.raises(ValueError, match="not a class"):
        BalancedOrder(labels, {"fox": 1.0}, names=["cat", "dog", "eel"])


@settings(max_examples=40, deadline=None)
@given(world=st.integers(1, 4), batch=st.integers(1, 7), n=st.integers(0, 150), drop_last=st.booleans())
def test_ranks_get_equal_batches_that_together_are_a_prefix(world, batch, n, drop_last):
    labels = np.arange(97) % 5
    samplers = [BalancedSampler(labels, batch_size=batch, num_samples=n, seed=3, rank=r, world_size=world,
                                drop_last=drop_last) for r in range(world)]
    got = [list(s) for s in samplers]
    assert len({len(g) for g in got}) == 1 and all(len(g) == len(s) for g, s in zip(got, samplers))
    order = samplers[0].indices()
    steps = len(got[0])
    taken = sorted(i for g in got for b in g for i in b)
    end = samplers[0].layout().position_after(steps)
    assert sorted(order[:end].tolist()) == taken


# -- exact resume through StatefulDataLoader, and elastic resume ------------------------------------

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]


class Indices(torch.utils.data.Dataset):
    """Sample i is i: the batches name the indices they hold."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


LABELS = np.minimum(np.arange(211) % 17, 6)  # class 6 holds most samples


def loader(sampler, workers: int, every: int):
    extra = {"prefetch_factor": 2} if workers else {}
    return stateful.StatefulDataLoader(Indices(len(LABELS)), batch_sampler=sampler, num_workers=workers,
                                       snapshot_every_n_steps=every, **extra)


@settings(max_examples=6, deadline=None)
@given(workers=st.integers(0, 2), world=st.integers(1, 3), batch=st.integers(1, 8), stop=st.floats(0, 1),
       every=st.integers(1, 3))
def test_stateful_dataloader_resumes_exactly(workers, world, batch, stop, every):
    def sampler():
        return BalancedSampler(LABELS, batch_size=batch, weights="inverse", seed=4, epoch=1, rank=world - 1,
                               world_size=world)

    reference = list(sampler())
    dl = loader(sampler(), workers, every)
    k = int(stop * len(reference))
    it = iter(dl)
    head = [next(it).tolist() for _ in range(k)]
    state = json.loads(json.dumps(dl.state_dict()))
    tail = [b.tolist() for b in it]
    assert head + tail == reference
    resumed = loader(sampler(), workers, every)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == tail
    assert global_position(state)["position"] == k * world * batch


def test_elastic_resume_from_a_global_position_and_refusals():
    make = lambda **kw: BalancedSampler(LABELS, batch_size=5, seed=2, **kw)  # noqa: E731
    states, first = [], []
    for rank in range(4):
        dl = loader(make(rank=rank, world_size=4), 1, 2)
        it = iter(dl)
        first += [i for _ in range(3) for i in next(it).tolist()]
        states.append(dl.state_dict())
        del it, dl
    pos = global_position(states)
    assert pos["position"] == 3 * 4 * 5
    rest = [list(make(rank=r, world_size=3, start=pos)) for r in range(3)]
    assert len({len(r) for r in rest}) == 1
    order = make(rank=0, world_size=1).indices()
    later = [i for r in rest for b in r for i in b]
    assert sorted(first) == sorted(order[:60].tolist())
    assert sorted(later) == sorted(order[60:60 + len(later)].tolist()) and len(order) - 60 - len(later) < 15
    with pytest.raises(ValueError, match="order"):  # another balance: another order
        BalancedSampler(LABELS, batch_size=5, seed=2, weights=[2] + [1] * 6, start=pos)
    with pytest.raises(ValueError, match="seed"):
        BalancedSampler(LABELS, batch_size=5, seed=3, rank=0, world_size=4).load_state_dict(
            make(rank=0, world_size=4).state_dict())


def test_labels_come_from_the_datasets(tmp_path):
    import test_hdf5_writer as hw
    import test_tar_loader as tl

    from shardsmith.loader import EventDataset, TarDataset

    tar = TarDataset(tl.write_dataset(tmp_path / "tar", {"train": tl.make_samples(23, "t")}, per_shard=10))
    assert tar.labels().tolist() == [tar[i]["cls"] for i in range(len(tar))]
    sampler = BalancedSampler(tar, batch_size=3, seed=0, rank=0, world_size=1)
    assert len(list(sampler)) == 23 // 3
    events = hw.make_events(50, seed=1)
    ev = EventDataset(hw.write_dataset(tmp_path / "ev", {"train": events}, shard_samples=16))
    assert ev.labels("run").tolist() == events.columns["run"].tolist()
    with pytest.raises(Exception, match="fixed integer scalar"):
        ev.labels("pos")


def test_the_readmes_balanced_loader_runs(tmp_path, monkeypatch):
    """docs/loader.md, "Class balance": the sampler example as written, on a converted image folder."""
    from pathlib import Path

    from conftest import jpeg, run_cli

    readme = (Path(__file__).resolve().parents[1] / "docs" / "loader.md").read_text()
    section = readme[readme.index("### Class balance"):]
    first = section.index("```python\n") + len("```python\n")
    code = section[first:section.index("```\n", first)]
    for label, (cls, n) in enumerate({"ant": 30, "bee": 5, "cat": 2}.items()):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(n):
            (tmp_path / "imgs" / cls / f"{i}.jpg").write_bytes(jpeg(label * 100 + i))
    assert run_cli("convert", tmp_path / "imgs", "-o", tmp_path / "out", "--to", "webdataset", "--quiet").exit_code == 0
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__main__"}
    exec(compile(code.replace('"demo-out/images"', repr(str(tmp_path / "out"))), "loader.md", "exec"), scope)
    report = scope["sampler"].report().as_dict(scope["ds"].classes)
    # 37 samples in batches of 16 (drop_last): the loader delivers 32 an epoch, and the report counts those
    assert {c: r["drawn"] for c, r in report.items()} == {"ant": 11, "bee": 11, "cat": 10}
    assert report["cat"]["repeated"] == 8 and len(scope["labels"]) == 16


def test_equal_shares_take_the_round_robin_the_general_rule_gives():
    from shardsmith.loader.balanced_order import _wf2q, class_sequence

    w = np.array([0.25, 0, 0.25, 0.25, 0.25])
    fast = class_sequence(w, 203, seed=7)
    assert sorted(fast[:4].tolist()) == [0, 2, 3, 4]
    order = {c: i for i, c in enumerate(fast[:4].tolist())}
    rank = [order.get(c, 9) for c in range(5)]
    assert np.array_equal(fast, _wf2q(w, 203, rank))


def test_the_report_counts_what_the_loader_delivers_on_every_rank():
    """drop_last leaves the last partial global step undrawn; without it every rank's short batch counts."""
    labels = np.repeat([0, 1, 2], [30, 5, 2])
    for world, drop_last in ((1, True), (2, True), (2, False), (3, False)):
        delivered = 0
        for rank in range(world):
            s = BalancedSampler(labels, batch_size=4, seed=0, rank=rank, world_size=world, drop_last=drop_last)
            delivered += sum(len(b) for b in s)
        assert sum(r["drawn"] for r in s.report().as_dict().values()) == delivered, (world, drop_last)


def _counted(labels_read, report) -> dict[str, int]:
    """Both as {class: draws}: what the loop read, and what the report says was drawn."""
    read = np.bincount(LABELS[np.asarray(labels_read, dtype=np.int64)], minlength=7)
    return {str(c): int(n) for c, n in enumerate(read) if n}, {c: r["drawn"] for c, r in report.as_dict().items()
                                                              if r["drawn"]}


def test_the_report_counts_the_samples_read_so_far_and_across_a_resume():
    """Issue 32: the report counted the whole epoch from the start; it counts what was delivered."""
    make = lambda: BalancedSampler(LABELS, batch_size=4, seed=1, rank=0, world_size=1)  # noqa: E731
    assert make().report().drawn.sum() == 0  # nothing drawn at construction
    dl = loader(make(), 0, 1)
    it, read = iter(dl), []
    for _ in range(5):  # k = 20 samples
        read += next(it).tolist()
        got, said = _counted(read, dl.batch_sampler.report())
        assert said == got and sum(said.values()) == len(read)
    state = json.loads(json.dumps(dl.state_dict()))
    resumed = loader(make(), 0, 1)
    resumed.load_state_dict(state)
    alone = make()  # the sampler's own state, loaded: counted before its next batch
    alone.load_state_dict(dl.batch_sampler.state_dict())
    assert alone.report().drawn.sum() == 20
    elastic = BalancedSampler(LABELS, batch_size=2, seed=1, rank=1, world_size=2, start=global_position(state))
    assert elastic.report().drawn.sum() == 20  # an elastic restart: the draws before its start were delivered
    it = iter(resumed)
    for _ in range(3):
        read += next(it).tolist()
    got, said = _counted(read, resumed.batch_sampler.report())
    assert said == got and sum(said.values()) == 32
    read += [i for batch in it for i in batch.tolist()]  # the epoch's end: every delivered draw, none more
    assert _counted(read, resumed.batch_sampler.report()) == _counted(read, make().report(steps=len(make())))
    assert len(read) == 211 // 4 * 4


def test_with_workers_the_loops_own_count_gives_the_exact_report():
    """A DataLoader with workers takes batches ahead of the loop; report(steps=) counts the loop's."""
    sampler = BalancedSampler(LABELS, batch_size=4, seed=1, rank=0, world_size=1)
    it, read = iter(loader(sampler, 2, 1)), []
    for _ in range(3):
        read += next(it).tolist()
    got, said = _counted(read, sampler.report(steps=3))
    assert said == got and sum(said.values()) == 12
    assert sampler.report().drawn.sum() >= 12  # the batches handed to the workers, read or not
    del it
