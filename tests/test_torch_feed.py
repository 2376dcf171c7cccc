"""DevicePrefetcher (docs/loader.md, "Feeding the GPU"; shardsmith/torch_feed.py): the wrapped
loader's batches unchanged, whatever their structure; its state counts the batches handed over,
not those in flight, so a StatefulDataLoader resumed from it yields exactly the next batch; errors
arrive in their turn.
The CUDA path (pinned buffers, side stream) runs only where a GPU is."""

from __future__ import annotations

from collections import namedtuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]
from test_torch_resume import token_dataset  # noqa: E402

import shardsmith  # noqa: E402
from shardsmith.torch import DevicePrefetcher, TokenBatches, map_tensors  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU path is tested here)")
Pair = namedtuple("Pair", "x y")


def same(a, b) -> bool:
    """Equal structure, equal tensors (on any device), equal other leaves."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(p, q) for p, q in zip(a, b))
    return a == b


def batch(i: int, kind: str):
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + i
    y = torch.tensor([i, -i], dtype=torch.int64)
    return {"tensor": x, "tuple": (x, y), "dict": {"x": x, "y": y},
            "nested": {"a": [x, (y, {"z": x.half()})], "key": f"k{i}", "n": i, "none": None},
            "named": Pair(x, y)}[kind]


@pytest.mark.parametrize("kind", ["tensor", "tuple", "dict", "nested", "named"])
@pytest.mark.parametrize("depth", [1, 3])
def test_same_batches_as_the_loader(kind, depth):
    batches = [batch(i, kind) for i in range(5)]
    got = list(DevicePrefetcher(batches, device="cpu", depth=depth))
    assert len(got) == 5 and all(same(a, b) for a, b in zip(batches, got))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 12), depth=st.integers(1, 5), size=st.integers(1, 4))
def test_any_depth_any_length(n, depth, size):
    loader = torch.utils.data.DataLoader(torch.arange(n * size), batch_size=size)
    assert same(list(DevicePrefetcher(loader, device="cpu", depth=depth)), list(loader))


def test_transform_runs_on_each_batch_after_the_move():
    seen = []

    def double(b):
        seen.append(b["x"].device.type)
        return {"x": b["x"] * 2, "key": b["key"]}

    got = list(DevicePrefetcher([{"x": torch.ones(2), "key": "a"}], device="cpu", transform=double))
    assert same(got, [{"x": torch.full((2,), 2.0), "key": "a"}]) and seen == ["cpu"]


def test_map_tensors_keeps_structure():
    b = batch(3, "nested")
    assert same(map_tensors(lambda t: t, b), b)
    assert map_tensors(lambda t: t + 1, (torch.zeros(1), "s"))[1] == "s"


def test_errors_arrive_after_the_batches_before_them():
    def failing():
        yield torch.zeros(1)
        yield torch.ones(1)
        raise RuntimeError("shard 3 is gone")

    got = []
    with pytest.raises(RuntimeError, match="shard 3 is gone"):
        for b in DevicePrefetcher(failing(), device="cpu", depth=2):
            got.append(b)
    assert same(got, [torch.zeros(1), torch.ones(1)])


def test_a_loader_without_state_says_so():
    p = DevicePrefetcher([torch.zeros(1)], device="cpu")
    assert len(list(p)) == 1
    with pytest.raises(TypeError, match="no state_dict"):
        p.state_dict()
    with pytest.raises(TypeError, match="no load_state_dict"):
        p.load_state_dict({})
    with pytest.raises(ValueError, match="depth=0"):
        DevicePrefetcher([], depth=0)


# -- resume through torchdata's StatefulDataLoader ---------------------------------------------------

N = 61  # windows of the token dataset: 15 batches of 4


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> shardsmith.TokenDataset:
    return shardsmith.TokenDataset(token_dataset(tmp_path_factory.mktemp("feed-tokens"), windows=N))


def token_loader(tokens, workers: int):
    extra = {"prefetch_factor": 2} if workers else {}
    return stateful.StatefulDataLoader(TokenBatches(tokens, batch_size=4, seed=3), batch_size=None,
                                       num_workers=workers, **extra)


def map_loader(workers: int):
    extra = {"prefetch_factor": 2} if workers else {}
    return stateful.StatefulDataLoader(list(range(40)), batch_size=3, shuffle=True,
                                       generator=torch.Generator().manual_seed(5), num_workers=workers, **extra)


def test_state_before_iterating_is_the_loaders(tokens):
    loader = token_loader(tokens, 0)
    assert DevicePrefetcher(loader, device="cpu").state_dict() == loader.state_dict()


@settings(max_examples=15, deadline=None)
@given(stop=st.integers(0, 15), depth=st.integers(1, 4))
def test_resume_gives_the_same_continuation(tokens, stop, depth):
    """Stop after ``stop`` batches (the prefetcher has pulled up to ``depth`` more), save, resume
    in a fresh loader: the rest equals the uninterrupted run's rest."""
    whole = list(token_loader(tokens, 0))
    feed = DevicePrefetcher(token_loader(tokens, 0), device="cpu", depth=depth)
    it = iter(feed)
    head = [next(it) for _ in range(stop)]
    state = feed.state_dict()
    again = DevicePrefetcher(token_loader(tokens, 0), device="cpu", depth=depth)
    again.load_state_dict(state)
    assert same(head + list(again), whole)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("which", ["tokens", "map"])
def test_resume_with_workers(tokens, workers, which):
    make = (lambda: token_loader(tokens, workers)) if which == "tokens" else (lambda: map_loader(workers))
    whole = list(make())
    feed = DevicePrefetcher(make(), device="cpu", depth=2)
    it = iter(feed)
    head = [next(it) for _ in range(5)]
    state = feed.state_dict()
    rest_here = list(it)  # the same prefetcher carries on past the snapshot
    again = DevicePrefetcher(make(), device="cpu", depth=2)
    again.load_state_dict(state)
    rest = list(again)
    assert same(head + rest, whole) and same(rest_here, rest)


def test_stop_and_restart_mid_epoch_in_the_same_prefetcher(tokens):
    """Break out, load the state saved there into the same prefetcher, iterate again: no batch is
    lost to the one that was in flight, none repeated."""
    whole = list(token_loader(tokens, 0))
    feed = DevicePrefetcher(token_loader(tokens, 0), device="cpu", depth=3)
    head = []
    for b in feed:
        head.append(b)
        if len(head) == 7:
            break
    feed.load_state_dict(feed.state_dict())
    assert same(head + list(feed), whole)


def test_set_epoch_reaches_dataset_and_transform(tokens):
    class Aug:
        epoch = None

        def __call__(self, b):
            return b

        def set_epoch(self, e):
            self.epoch = e

    loader = token_loader(tokens, 0)
    feed = DevicePrefetcher(loader, device="cpu", transform=Aug())
    feed.set_epoch(4)
    assert loader.dataset.epoch == 4 and feed.transform.epoch == 4


# -- CUDA ----------------------------------------------------------------------------------------------

@CUDA
@pytest.mark.parametrize("pin_memory", [False, True])
def test_cuda_batches_arrive_whole(pin_memory):
    loader = torch.utils.data.DataLoader([{"x": torch.full((64, 64), float(i)), "k": str(i)} for i in range(9)],
                                         batch_size=2, pin_memory=pin_memory)
    feed = DevicePrefetcher(loader, device="cuda", depth=2)
    out = []
    for b in feed:
        assert b["x"].is_cuda
        out.append({"x": (b["x"] * 1).cpu(), "k": b["k"]})  # used on the default stream
    assert same(out, list(loader))


@CUDA
def test_cuda_pinned_buffers_are_reused_without_overwriting():
    """Batches of varying size through 2 slots of buffers: every batch arrives as it was made."""
    batches = [torch.randn(256 + 17 * (i % 3), 1024) for i in range(12)]
    feed = DevicePrefetcher(batches, device="cuda", depth=1)
    got = [torch.mm(b, b.T).diagonal().cpu() for b in feed]
    want = [(b * b).sum(1) for b in batches]
    assert all(torch.allclose(g, w, rtol=1e-4, atol=1e-2) for g, w in zip(got, want))


@CUDA
def test_cuda_transform_runs_on_the_side_stream(tokens):
    streams = []

    def record(b):
        streams.append(torch.cuda.current_stream())
        return b

    feed = DevicePrefetcher(token_loader(tokens, 0), device="cuda", transform=record)
    whole = list(token_loader(tokens, 0))
    assert same([map_tensors(lambda t: t.cpu(), b) for b in feed], whole)
    assert streams and all(s != torch.cuda.default_stream() for s in streams)
