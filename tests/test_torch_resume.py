"""Stateful torch adapters: exact resume through torchdata's StatefulDataLoader (any workers,
prefetch and snapshot interval), elastic resume from a global position under another rank and
worker layout, and batches that do not depend on num_workers (docs/design.md, "Loader")."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import shardsmith
from shardsmith.core import manifest
from shardsmith.formats.tokens.writer import idx_bytes
from shardsmith.kit import manifest_io
from shardsmith.kit.rank_split import EpochLayout

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
# torchdata's own notices (a deprecated torch call; more workers than this machine's 2 cores)
pytestmark = [pytest.mark.heavy,  # DataLoader workers in every test: `make test-heavy`
              pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]
from shardsmith.torch import (  # noqa: E402
    EpochBatchSampler,
    EventBatches,
    TarIterable,
    TokenBatches,
    TokenWindows,
    global_position,
)

L = 4  # window length: window i's x starts with token i·L, so x[:, 0] // L names the window
N = 233  # windows: a prime, so no batch layout divides it


def token_dataset(out: Path, *, windows: int, seq_len: int = L, shards: int = 3, vocab: int = 65000) -> Path:
    """Token ids 0, 1, 2, ... (mod ``vocab``) in ``shards`` Megatron shards, written directly."""
    out.mkdir(parents=True, exist_ok=True)
    tokens = (np.arange(windows * seq_len + 1, dtype=np.int64) % vocab).astype(np.uint16)
    (out / "tokenizer.json").write_text("{}")
    entries = []
    for s, part in enumerate(np.array_split(tokens, shards)):
        files = out / f"train-{s:05d}.bin", out / f"train-{s:05d}.idx"
        files[0].write_bytes(part.tobytes())
        files[1].write_bytes(idx_bytes(np.array([len(part)]), np.dtype(np.uint16)))
        sha = [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
        entries.append({"path": files[0].name, "samples": 1, "bytes": files[0].stat().st_size, "sha256": sha[0],
                        "tokens": len(part), "index": {"path": files[1].name, "bytes": files[1].stat().st_size,
                                                       "sha256": sha[1]}})
    tok = {"path": "tokenizer.json", "sha256": hashlib.sha256(b"{}").hexdigest(), "vocab_size": vocab,
           "dtype": "uint16"}
    m = manifest.new_manifest(fmt="tokens", seed=0, shuffle=True, source={"reader": "test", "inputs": []},
                              schema={}, splits={"train": {"samples": shards, "shards": entries}}, tokenizer=tok,
                              seq_len=seq_len)
    manifest_io.save(out, m)
    return out


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> shardsmith.TokenDataset:
    return shardsmith.TokenDataset(token_dataset(tmp_path_factory.mktemp("tokens"), windows=N))


def loader(dataset, workers: int, *, prefetch: int = 2, every: int = 1, **kwargs):
    extra = {"prefetch_factor": prefetch} if workers else {}
    return stateful.StatefulDataLoader(dataset, num_workers=workers, snapshot_every_n_steps=every, **extra, **kwargs)


def windows(batch) -> list[int]:
    return (batch[0][:, 0] // L).tolist()


def same(a, b) -> bool:
    """Batches equal byte for byte (x and y)."""
    return len(a) == len(b) and all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))


# -- the layout alone (numpy): fast, many examples -------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 300), start=st.integers(0, 300), batch=st.integers(1, 9), world=st.integers(1, 5),
       drop_last=st.booleans(), data=st.data())
def test_layout_deals_each_position_once_in_equal_counts(n, start, batch, world, drop_last, data):
    start = min(start, n)
    layouts = [EpochLayout(total=n, start=start, batch_size=batch, rank=r, world_size=world, drop_last=drop_last)
               for r in range(world)]
    assert len({lay.steps for lay in layouts}) == 1
    steps = layouts[0].steps
    taken = [np.arange(n)[lay.positions(s)] for lay in layouts for s in range(steps)]
    flat = np.concatenate(taken) if taken else np.zeros(0, int)
    end = layouts[0].position_after(steps)
    assert sorted(flat.tolist()) == list(range(start, end))  # each once, nothing before start
    assert n - end < world * batch if drop_last else n - end < world
    k = data.draw(st.integers(0, steps))  # after k lockstep steps the consumed positions are a prefix
    consumed = [np.arange(n)[lay.positions(s)] for lay in layouts for s in range(k)]
    got = sorted(np.concatenate(consumed).tolist()) if consumed else []
    assert got == list(range(start, layouts[0].position_after(k)))


# -- exact resume through StatefulDataLoader, and batches independent of num_workers ---------------

@settings(max_examples=12, deadline=None)
@given(workers=st.integers(0, 3), prefetch=st.integers(1, 3), every=st.integers(1, 4), world=st.integers(1, 3),
       batch=st.integers(1, 9), stop=st.floats(0, 1), data=st.data())
def test_resume_equals_the_uninterrupted_tail(tokens, workers, prefetch, every, world, batch, stop, data):
    rank = data.draw(st.integers(0, world - 1))

    def adapter():
        return TokenBatches(tokens, batch_size=batch, seed=5, epoch=2, rank=rank, world_size=world)

    reference = list(adapter())  # one process, no DataLoader
    assert len(reference) == len(tokens) // (world * batch) == len(adapter())
    dl = loader(adapter(), workers, prefetch=prefetch, every=every, batch_size=None)
    k = int(stop * len(reference))
    it = iter(dl)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(dl.state_dict()))  # survives a JSON checkpoint
    tail = list(it)
    assert same(head + tail, reference)  # the same batches for any num_workers
    resumed = loader(adapter(), workers, prefetch=prefetch, every=every, batch_size=None)
    resumed.load_state_dict(state)
    assert same(list(resumed), tail)
    assert global_position(state)["position"] == k * world * batch


@settings(max_examples=4, deadline=None)
@given(workers=st.integers(0, 3), world=st.integers(1, 3), batch=st.integers(1, 9), stop=st.floats(0, 1),
       every=st.integers(1, 3))
def test_map_style_resume_through_our_sampler(tokens, workers, world, batch, stop, every):
    def sampler():
        return EpochBatchSampler(tokens, batch_size=batch, seed=9, rank=world - 1, world_size=world)

    reference = [tokens.get_batch(np.asarray(b)) for b in sampler()]
    dl = loader(TokenWindows(tokens), workers, every=every, batch_sampler=sampler())
    k = int(stop * len(reference))
    it = iter(dl)
    head = [next(it) for _ in range(k)]
    state = dl.state_dict()
    tail = list(it)
    expect = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in reference]
    assert same(head + tail, expect)
    resumed = loader(TokenWindows(tokens), workers, every=every, batch_sampler=sampler())
    resumed.load_state_dict(state)
    assert same(list(resumed), tail)
    assert global_position(state)["position"] == k * world * batch


# -- elastic: saved at one layout, resumed at another ----------------------------------------------

def run_ranks(world: int, workers: int, batch: int, *, start=None, steps: int | None = None):
    """Every rank's loader in lockstep for ``steps`` batches (None: to the end of the epoch):
    the windows each rank got, and each rank's saved state."""
    seen, states = [], []
    for rank in range(world):
        ds = TokenBatches(tokens_ds, batch_size=batch, seed=3, epoch=1, rank=rank, world_size=world, start=start)
        dl = loader(ds, workers, batch_size=None, every=2)
        it = iter(dl)
        got = [windows(next(it)) for _ in range(steps)] if steps is not None else [windows(b) for b in it]
        seen.append(got)
        states.append(json.loads(json.dumps(dl.state_dict())))
        del it, dl
    return seen, states


tokens_ds: shardsmith.TokenDataset


@settings(max_examples=8, deadline=None)
@given(before=st.tuples(st.integers(1, 4), st.integers(0, 2), st.integers(1, 8)),
       after=st.tuples(st.integers(1, 4), st.integers(0, 2), st.integers(1, 8)), stop=st.floats(0, 1))
@example(before=(4, 2, 5), after=(2, 3, 5), stop=0.5)  # the case: 4 ranks × 2 workers to 2 × 3
@example(before=(4, 2, 5), after=(1, 0, 7), stop=0.3)  # ... and to 1 × 0, another batch size
def test_elastic_resume_covers_the_rest_once(tokens, before, after, stop):
    global tokens_ds
    tokens_ds = tokens
    (w1, nw1, b1), (w2, nw2, b2) = before, after
    k = int(stop * (N // (w1 * b1)))
    first, states = run_ranks(w1, nw1, b1, steps=k)
    pos = global_position(states)
    assert pos["position"] == k * w1 * b1 and pos["epoch"] == 1
    assert global_position(states[-1]) == pos  # in lockstep one rank's state says as much
    rest, _ = run_ranks(w2, nw2, b2, start=pos)
    assert len({len(r) for r in rest}) == 1  # equal batch counts per rank
    consumed = sorted(i for r in first for b in r for i in b)
    later = [i for r in rest for b in r for i in b]
    order = shardsmith.kit.order.epoch_order(N, shuffle=True, seed=3, epoch=1)
    assert consumed == sorted(order[:pos["position"]].tolist())  # what the first layout took: a prefix
    left = N - pos["position"]
    assert sorted(later) == sorted(order[pos["position"]:N - left % (w2 * b2)].tolist())  # the rest, each once


def test_plain_dataloader_resumes_from_a_start_offset(tokens):
    """torch's DataLoader keeps no state: count the steps, and start a new adapter at ``position(steps)``."""
    ds = TokenBatches(tokens, batch_size=6, seed=1, rank=0, world_size=2)
    full = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    start = ds.position(7)
    assert start["position"] == 7 * 2 * 6
    again = TokenBatches(tokens, batch_size=6, seed=1, rank=0, world_size=2, start=start)
    assert same(list(torch.utils.data.DataLoader(again, batch_size=None, num_workers=1)), full[7:])
    again.set_epoch(1)  # the start belongs to its epoch: the next one starts at 0
    assert len(again) == len(tokens) // 12 and again.start == 0


def test_states_of_another_run_are_refused(tokens):
    ds = TokenBatches(tokens, batch_size=4, seed=1, rank=0, world_size=1)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    assert state["produced"] == 1
    with pytest.raises(ValueError, match="seed"):
        TokenBatches(tokens, batch_size=4, seed=2, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        TokenBatches(tokens, batch_size=5, seed=1, rank=0, world_size=1).load_state_dict(state)
    other = dict(state, rank=1, world_size=2)
    lagging = dict(state, rank=0, world_size=2, produced=0)
    with pytest.raises(ValueError, match="different steps"):
        global_position([dict(other, produced=1), lagging])
    with pytest.raises(ValueError, match="length"):
        TokenBatches(tokens, batch_size=4, start={**global_position(state), "length": 5})
    resumed = TokenBatches(tokens, batch_size=4, seed=1, rank=0, world_size=1, epoch=7)
    resumed.load_state_dict(state)  # the state's epoch wins
    assert resumed.epoch == 0 and same(list(resumed), list(it))


# -- tar and event adapters ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tar_dataset(tmp_path_factory):
    import test_tar_loader as tl

    return tl.write_dataset(tmp_path_factory.mktemp("tar") / "out", {"train": tl.make_samples(47, "t")},
                            per_shard=10)


@pytest.fixture(scope="module")
def event_dataset(tmp_path_factory):
    import test_hdf5_writer as hw

    return hw.write_dataset(tmp_path_factory.mktemp("events"), {"train": hw.make_events(300, seed=4)},
                            shard_samples=64)


@pytest.mark.parametrize("batch", [None, 4])
def test_tar_iterable_resumes_and_ignores_workers(tar_dataset, batch):
    from shardsmith.loader import TarDataset

    ds = TarDataset(tar_dataset)
    keys = (lambda b: [s["__key__"] for s in b]) if batch else (lambda s: s["__key__"])
    make = lambda: TarIterable(ds, batch_size=batch, seed=2, rank=1, world_size=2)  # noqa: E731
    reference = [keys(b) for b in make()]
    dl = loader(make(), 2, every=3, batch_size=None)
    it = iter(dl)
    head = [keys(next(it)) for _ in range(5)]
    state = dl.state_dict()
    tail = [keys(b) for b in it]
    assert head + tail == reference
    resumed = loader(make(), 2, every=3, batch_size=None)
    resumed.load_state_dict(state)
    assert [keys(b) for b in resumed] == tail
    if batch:
        assert global_position(state)["position"] == 5 * 2 * batch
    else:
        with pytest.raises(ValueError, match="batch_size=B on the adapter"):
            global_position(state)


def test_event_batches_resume_and_elastic(event_dataset):
    from shardsmith.torch import event_collate

    ev = shardsmith.open(event_dataset)
    make = lambda **kw: EventBatches(ev, batch_size=16, block=32, seed=1, collate=event_collate(ragged="flat"),  # noqa: E731
                                     **kw)
    runs = lambda bs: [b["run"].tolist() for b in bs]  # noqa: E731
    reference = runs(make(rank=0, world_size=1))
    dl = loader(make(rank=0, world_size=1), 3, every=2, batch_size=None)
    assert runs(dl) == reference  # the single-process batches with 3 workers
    dl = loader(make(rank=0, world_size=1), 2, batch_size=None)
    it = iter(dl)
    head = [next(it)["run"].tolist() for _ in range(6)]
    state = dl.state_dict()
    resumed = loader(make(rank=0, world_size=1), 2, batch_size=None)
    resumed.load_state_dict(state)
    assert head + runs(resumed) == reference
    pos = global_position(state)
    rest = [runs(make(rank=r, world_size=2, start=pos)) for r in range(2)]
    assert len(rest[0]) == len(rest[1]) == 7 and len(rest[0][-1]) == 6  # 6 steps of 2 × 16, then 2 × 6
    flat = [v for r in rest for b in r for v in b]
    assert len(flat) == len(set(flat)) == 300 - 96 and not set(flat) & {v for b in head for v in b}


def test_the_readmes_training_loop_runs_and_resumes(tmp_path, monkeypatch):
    """docs/loader.md, "Resuming training": the loop as written, run fresh and then restarted from its save."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "loader.md").read_text()
    section = readme[readme.index("### Resuming training"):]
    first = section.index("```python\n") + len("```python\n")
    code = section[first:section.index("```\n", first)]
    out = token_dataset(tmp_path / "tokens", windows=200, seq_len=128, vocab=512)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tour" / "loader").mkdir(parents=True)
    for run in range(2):  # 25 batches an epoch, saved at batch 20: the second run resumes there
        scope: dict = {"__name__": "__main__"}
        exec(compile(code.replace('"demo-out/tokens"', repr(str(out))), "loader.md", "exec"), scope)
        assert scope["epoch"] == 1 and scope["first_epoch"] == run  # the restart began in epoch 1
        saved = json.loads((tmp_path / "tour" / "loader" / "loader-rank0.json").read_text())
        assert saved["epoch"] == 1 and global_position(saved["loader"])["position"] == 20 * 8
    at = section.index("```python\n", first) + len("```python\n")  # the elastic restart, after the run
    elastic = textwrap.dedent(section[at:section.index("```\n", at)])
    restarted = {"__name__": "__main__"}
    exec(compile(elastic.replace('"demo-out/tokens"', repr(str(out))), "loader.md", "exec"), restarted)
    assert restarted["first_epoch"] == 1 and restarted["batches"].start == 160
    assert len(list(restarted["loader"])) == (200 - 160) // 8
