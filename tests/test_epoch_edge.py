"""A loader state meets ``set_epoch`` (issue 26, item 3): torchdata's ``StatefulDataLoader`` applies
a loaded state at ``iter()``, after the loop's ``set_epoch``, so the adapter or sampler sees the
state last. A state of an earlier epoch is finished first and ``set_epoch``'s epoch follows from its
start (so a state saved after an epoch's last batch gives the next epoch, not a replay), one of the
same epoch resumes exactly, one of a later epoch is refused; for every adapter and sampler, any
``num_workers`` and snapshot interval, whichever of ``load_state_dict`` and ``set_epoch`` comes first."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsmith

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]
from test_torch_resume import L, token_dataset  # noqa: E402

from shardsmith.torch import (  # noqa: E402
    BalancedSampler,
    EpochBatchSampler,
    EventBatches,
    TarIterable,
    TokenBatches,
    TokenWindows,
    event_collate,
)

KINDS = ["EpochBatchSampler", "BalancedSampler", "TokenBatches", "TarIterable", "EventBatches"]
E = 3  # the epoch the state is saved in


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    import test_hdf5_writer as hw
    import test_tar_loader as tl

    from shardsmith.loader import TarDataset

    root = tmp_path_factory.mktemp("epoch_edge")
    tokens = shardsmith.TokenDataset(token_dataset(root / "tokens", windows=41))
    tar = TarDataset(tl.write_dataset(root / "tar", {"train": tl.make_samples(23, "t")}, per_shard=8))
    events = shardsmith.open(hw.write_dataset(root / "events", {"train": hw.make_events(90, seed=2)},
                                              shard_samples=32))
    return {"tokens": tokens, "tar": tar, "events": events}


def build(kind: str, data, workers: int, every: int = 1):
    """(the adapter or sampler that takes ``set_epoch``, a StatefulDataLoader over it, batch -> ids)."""
    by_window = lambda b: (b[0][:, 0] // L).tolist()  # noqa: E731
    if kind in ("EpochBatchSampler", "BalancedSampler"):
        n = len(data["tokens"])
        obj = (EpochBatchSampler(n, batch_size=3, seed=4) if kind == "EpochBatchSampler"
               else BalancedSampler([i % 3 for i in range(n)], batch_size=3, seed=4))
        return obj, loader(TokenWindows(data["tokens"]), workers, every, batch_sampler=obj), by_window
    if kind == "TokenBatches":
        obj, ids = TokenBatches(data["tokens"], batch_size=3, seed=4), by_window
    elif kind == "TarIterable":
        obj = TarIterable(data["tar"], batch_size=2, seed=4)
        ids = lambda b: [s["__key__"] for s in b]  # noqa: E731
    else:
        obj = EventBatches(data["events"], batch_size=8, block=16, seed=4, collate=event_collate(ragged="flat"))
        ids = lambda b: b["run"].tolist()  # noqa: E731
    return obj, loader(obj, workers, every, batch_size=None), ids


def loader(dataset, workers: int, every: int, **kwargs):
    extra = {"prefetch_factor": 2} if workers else {}
    return stateful.StatefulDataLoader(dataset, num_workers=workers, snapshot_every_n_steps=every, **extra, **kwargs)


def reference(kind: str, data, epoch: int) -> list:
    """A fresh run's batches of ``epoch`` (one process: the batches do not depend on num_workers)."""
    obj, dl, ids = build(kind, data, 0)
    obj.set_epoch(epoch)
    return [ids(b) for b in dl]


def saved(kind: str, data, workers: int, epoch: int, steps: int | None, *, every: int = 1,
          exhausted: bool = False) -> dict:
    """The loader's state after ``steps`` batches of ``epoch`` (None: its last batch; ``exhausted``:
    after the loop has also seen the end), through JSON as a checkpoint keeps it."""
    obj, dl, ids = build(kind, data, workers, every)
    obj.set_epoch(epoch)
    it = iter(dl)
    for _ in range(len(obj) if steps is None else steps):
        next(it)
    if exhausted:
        assert list(it) == []
    return json.loads(json.dumps(dl.state_dict()))


def resumed(kind: str, data, workers: int, state: dict, epoch: int, *, load_first: bool, every: int = 1):
    """A fresh loader given ``state`` and ``set_epoch(epoch)`` in either order: its batches, and the
    adapter's or sampler's epoch after them."""
    obj, dl, ids = build(kind, data, workers, every)
    if load_first:
        dl.load_state_dict(state)
        obj.set_epoch(epoch)
    else:
        obj.set_epoch(epoch)
        dl.load_state_dict(state)
    got = [ids(b) for b in dl]
    return got, obj.epoch


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_a_state_at_an_epochs_end_yields_to_the_next_epoch(data, kind, workers):
    """The issue's case: saved after the last batch of epoch E, loaded, ``set_epoch(E + 1)``: epoch
    E + 1 from its start (not epoch E again, nor a part of it); with workers also from a snapshot
    taken batches before (torchdata discards the batches yielded since) and at a worker other than
    the first (it goes on at the one after the last that yielded)."""
    expect = reference(kind, data, E + 1)
    assert expect != reference(kind, data, E)  # the epochs' orders differ, so a replay would show
    for every, exhausted in ((1, False), (1, True)) + (((4, False),) if workers else ()):
        state = saved(kind, data, workers, E, None, every=every, exhausted=exhausted)
        for load_first in (False, True):
            got, epoch = resumed(kind, data, workers, state, E + 1, load_first=load_first, every=every)
            assert (got, epoch) == (expect, E + 1), (every, exhausted, load_first)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_a_state_of_the_same_epoch_resumes_exactly(data, kind, workers):
    whole = reference(kind, data, E)
    for steps in (0, len(whole) // 2, len(whole)):  # at the end: nothing more of that epoch
        state = saved(kind, data, workers, E, steps)
        for load_first in (False, True):
            assert resumed(kind, data, workers, state, E, load_first=load_first) == (whole[steps:], E)


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_mid_epoch_is_finished_before_a_later_epoch(data, kind):
    """Nothing of the saved epoch is lost or repeated: its rest, then the asked epoch from its start."""
    state = saved(kind, data, 0, E, 2)
    expect = reference(kind, data, E)[2:] + reference(kind, data, E + 2)
    assert resumed(kind, data, 0, state, E + 2, load_first=False) == (expect, E + 2)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["EpochBatchSampler", "TokenBatches"])
def test_a_state_of_a_later_epoch_is_refused(data, kind, workers):
    """``set_epoch`` asked for an epoch before the state's: neither silently replays nor skips."""
    state = saved(kind, data, workers, E, 2)
    for load_first in (False, True):
        with pytest.raises(ValueError, match=f"epoch {E}"):
            resumed(kind, data, workers, state, E - 1, load_first=load_first)


def test_the_adapters_own_methods_in_either_order(data):
    """Without a DataLoader: ``load_state_dict`` and ``set_epoch`` on the adapter itself."""
    ds = TokenBatches(data["tokens"], batch_size=3, seed=4, epoch=E)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    rest = [b[0] for b in it]
    following = [b[0] for b in TokenBatches(data["tokens"], batch_size=3, seed=4, epoch=E + 1)]
    for first in ("load", "set"):
        for epoch, expect in ((E, rest), (E + 1, rest + following)):
            again = TokenBatches(data["tokens"], batch_size=3, seed=4)
            if first == "load":
                again.load_state_dict(state)
                again.set_epoch(epoch)
            else:
                again.set_epoch(epoch)
                again.load_state_dict(state)
            got = [b[0] for b in again]
            assert len(got) == len(expect) and all(torch.equal(a, b) for a, b in zip(got, expect))
        again = TokenBatches(data["tokens"], batch_size=3, seed=4)
        if first == "load":
            again.load_state_dict(state)
            again.set_epoch(E - 1)
        else:
            again.set_epoch(E - 1)
            again.load_state_dict(state)
        with pytest.raises(ValueError, match=f"epoch {E}"):  # when the iteration starts
            iter(again)
    fresh = TokenBatches(data["tokens"], batch_size=3, seed=4, epoch=7)  # no set_epoch: the state's epoch wins
    fresh.load_state_dict(state)
    assert fresh.epoch == E and len(list(fresh)) == len(rest)


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(KINDS), epoch=st.integers(0, 3), stop=st.floats(0, 1), later=st.integers(0, 2),
       workers=st.sampled_from([0, 2]), every=st.integers(1, 4), load_first=st.booleans())
def test_resume_then_set_epoch(data, kind, epoch, stop, later, workers, every, load_first):
    whole = reference(kind, data, epoch)
    steps = int(stop * len(whole))
    state = saved(kind, data, workers, epoch, steps, every=every)
    expect = whole[steps:] + (reference(kind, data, epoch + later) if later else [])
    got = resumed(kind, data, workers, state, epoch + later, load_first=load_first, every=every)
    assert got == (expect, epoch + later)


# The rule on ``EpochStream`` itself (a sampler, no DataLoader), as a reviewer met it: a state saved
# 4 batches into epoch 3 of 10, and set_epoch / load_state_dict / state_dict / len before iterating.
SAMPLERS = {"EpochBatchSampler": lambda: EpochBatchSampler(40, batch_size=4, seed=4),
            "BalancedSampler": lambda: BalancedSampler([i % 3 for i in range(40)], batch_size=4, seed=4)}


def epoch_of(make, epoch: int) -> list:
    s = make()
    s.set_epoch(epoch)
    return list(s)


def state_in(make, epoch: int, steps: int) -> dict:
    s = make()
    s.set_epoch(epoch)
    it = iter(s)
    for _ in range(steps):
        next(it)
    return json.loads(json.dumps(s.state_dict()))


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_pending_state_is_what_state_dict_gives(name):
    """Loaded and not yet iterated, the state is what ``state_dict`` returns: saved again and loaded,
    it gives the same batches (not the asked epoch from its start, losing the saved epoch's rest)."""
    make = SAMPLERS[name]
    s3, s5 = state_in(make, E, 4), state_in(make, 5, 2)
    rest = epoch_of(make, E)[4:]
    for state, asked, expect in ((s3, E + 1, rest + epoch_of(make, E + 1)), (s3, E, rest),
                                 (s5, 5, epoch_of(make, 5)[2:])):
        for load_first in (False, True):
            s = make()
            (s.load_state_dict(state), s.set_epoch(asked)) if load_first else (s.set_epoch(asked), s.load_state_dict(state))
            assert s.state_dict() == state
            again = make()
            again.set_epoch(asked)
            again.load_state_dict(json.loads(json.dumps(s.state_dict())))
            assert list(again) == list(s) == expect


@pytest.mark.parametrize("name", SAMPLERS)
def test_len_is_what_the_next_iteration_yields(name):
    """A pending state of an earlier epoch counts its rest, one of the same epoch from where it was saved."""
    make = SAMPLERS[name]
    s3, end3 = state_in(make, E, 4), state_in(make, E, 10)
    for state, asked in ((None, E), (s3, E + 1), (s3, E), (s3, E + 2), (end3, E + 1), (end3, E)):
        s = make()
        s.set_epoch(asked)
        if state is not None:
            s.load_state_dict(state)
        n = len(s)
        assert n == len(list(s)), (state is None, asked)
        assert len(s) == len(list(s)) == 10  # the iteration after: the asked epoch, whole


@pytest.mark.parametrize("name", SAMPLERS)
def test_the_latest_set_epoch_before_iterating_is_the_epoch(name):
    """``set_epoch`` names the next iteration's epoch, the latest call winning as without a state
    (set_epoch(4), set_epoch(5): epoch 5); the state is matched against it when the iteration starts."""
    make = SAMPLERS[name]
    s3 = state_in(make, E, 4)
    rest = epoch_of(make, E)[4:]
    for calls, expect in (([E + 1, E + 2], rest + epoch_of(make, E + 2)), ([E + 1, E], rest),
                          ([E - 1, E + 1], rest + epoch_of(make, E + 1))):
        s = make()
        s.set_epoch(calls[0])
        s.load_state_dict(s3)
        s.set_epoch(calls[1])
        assert s.state_dict() == s3 and len(s) == len(expect) and list(s) == expect, calls
    s = make()
    s.set_epoch(E + 1)
    s.load_state_dict(s3)
    s.set_epoch(E - 1)  # refused when the iteration starts, not before; the state stays for a right set_epoch
    with pytest.raises(ValueError, match=f"epoch {E}"):
        iter(s)
    assert s.state_dict() == s3
    s.set_epoch(E)
    assert list(s) == rest


@pytest.mark.parametrize("name", SAMPLERS)
def test_an_earlier_set_epoch_does_not_refuse_a_later_state(name):
    """set_epoch(0) somewhere, then a checkpoint of epoch 5 loaded, then set_epoch(5): it resumes."""
    make = SAMPLERS[name]
    s5 = state_in(make, 5, 3)
    s = make()
    s.set_epoch(0)
    s.load_state_dict(s5)
    s.set_epoch(5)
    assert s.epoch == 5 and list(s) == epoch_of(make, 5)[3:]
    s = make()
    s.set_epoch(0)
    s.load_state_dict(s5)  # no set_epoch(5): refused when it is iterated
    with pytest.raises(ValueError, match="epoch 5"):
        list(s)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(SAMPLERS)),
       calls=st.lists(st.one_of(st.tuples(st.just("set"), st.integers(0, 6)),
                                st.tuples(st.just("load"), st.sampled_from([(E, 4), (E, 10), (5, 3)]))), max_size=4))
def test_any_calls_before_iterating(name, calls):
    """Any sequence of ``set_epoch`` and ``load_state_dict``: the epoch is the latest ``set_epoch``'s
    (none: the last state's); the last state loaded resumes in it, or is finished before it, or is
    refused; ``state_dict()`` gives that state back and ``len()`` counts what is yielded."""
    make = SAMPLERS[name]
    s = make()
    asked, state = None, None
    for call, arg in calls:
        if call == "set":
            s.set_epoch(arg)
            asked = arg
        else:
            state = state_in(make, *arg)
            s.load_state_dict(state)
    epoch = asked if asked is not None else state["epoch"] if state else 0
    if state is not None:
        assert s.state_dict() == state
    if state is not None and state["epoch"] > epoch:
        for touch in (len, list):
            with pytest.raises(ValueError, match=f"epoch {state['epoch']}"):
                touch(s)
        return
    expect = epoch_of(make, epoch)
    if state is not None and state["epoch"] == epoch:
        expect = expect[state["produced"]:]
    elif state is not None:
        expect = epoch_of(make, state["epoch"])[state["produced"]:] + expect
    assert len(s) == len(expect) and list(s) == expect and s.epoch == epoch
