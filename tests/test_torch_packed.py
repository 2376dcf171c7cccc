"""Packed datasets in training (issue 16): ``PackedSequences`` from ``shardsmith.loader``, varlen
batches with one flat ``cu_seqlens`` (``PackedBatches``, ``varlen_collate``), exact resume through
torchdata's StatefulDataLoader at 0, 1 and 2 workers, elastic ``start=``, and mixtures of packed
datasets (``mix``, the recipe's ``[mix]`` table) through ``MixBatches``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_docs, run_cli, write_jsonl
from hypothesis import example, given, settings
from hypothesis import strategies as st

import shardsmith

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]
from shardsmith.loader import PackedSequences  # noqa: E402
from shardsmith.torch import MixBatches, PackedBatches, global_position, varlen_collate  # noqa: E402

N = 48  # sequence length


def packed(root: Path, tokenizer: Path, *, docs: int, seed: int, seq_len: int = N) -> PackedSequences:
    write_jsonl(root / "docs" / "a.jsonl", make_docs(docs, seed=seed, max_words=70))
    res = run_cli("pack-tokens", root / "docs", "-o", root / "out", "--tokenizer", tokenizer, "--pack", "best-fit",
                  "--seq-len", str(seq_len), "--pack-window", "2K", "--shard-tokens", "3K", "-q")
    assert res.exit_code == 0, res.stderr
    return shardsmith.open(root / "out")


@pytest.fixture(scope="module")
def seqs(tmp_path_factory, bpe_tokenizer) -> PackedSequences:
    return packed(tmp_path_factory.mktemp("packed"), bpe_tokenizer, docs=160, seed=2)


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(p.keys() == q.keys() and all(
        torch.equal(p[k], q[k]) if torch.is_tensor(p[k]) else p[k] == q[k] for k in p) for p, q in zip(a, b))


def loader(dataset, workers: int, *, every: int = 1):
    extra = {"prefetch_factor": 2} if workers else {}
    return stateful.StatefulDataLoader(dataset, batch_size=None, num_workers=workers, snapshot_every_n_steps=every,
                                       **extra)


def test_the_loader_exports_packed_sequences(seqs):
    assert type(seqs) is PackedSequences and shardsmith.loader.PackedSequences is PackedSequences
    assert len(seqs) > 60 and len(seqs.manifest["splits"]["train"]["shards"]) > 1


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_batch_has_one_flat_cu_seqlens_as_flash_attn_takes_it(seqs, data):
    rows = data.draw(st.lists(st.integers(0, len(seqs) - 1), min_size=1, max_size=9))
    batch = varlen_collate(seqs.get_batch(rows))
    tokens, cu, real, pos = batch["tokens"], batch["cu_seqlens"], batch["real"], batch["position_ids"]
    assert tokens.shape == (len(rows), N) and tokens.dtype == torch.int64
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == len(rows) * N and bool((cu.diff() > 0).all())
    assert batch["max_seqlen"] == int(cu.diff().max())
    ends = set(cu.tolist())
    for j, i in enumerate(rows):
        item = seqs[i]
        assert torch.equal(tokens[j], torch.from_numpy(item["tokens"])) and real[j] == item["cu_seqlens"][-1]
        inside = sorted(e - j * N for e in ends if j * N <= e <= (j + 1) * N)
        # the row's own boundaries, then its padding tail as one more segment: no segment crosses a row
        want = item["cu_seqlens"].tolist() + ([N] if item["cu_seqlens"][-1] < N else [])
        assert inside == want
        assert bool((tokens[j, int(real[j]):] == seqs.pad_id).all())
    flat = pos.reshape(-1)
    assert bool((flat[cu[:-1].long()] == 0).all()) and int(flat.max()) < batch["max_seqlen"]


@settings(max_examples=7, deadline=None)
@given(workers=st.integers(0, 2), every=st.integers(1, 3), world=st.integers(1, 3), batch=st.integers(1, 6),
       stop=st.floats(0, 1), data=st.data())
@example(workers=2, every=1, world=1, batch=4, stop=0.5, data=None)
def test_resume_through_stateful_dataloader_equals_the_uninterrupted_tail(seqs, workers, every, world, batch,
                                                                          stop, data):
    rank = data.draw(st.integers(0, world - 1)) if data is not None else 0

    def adapter():
        return PackedBatches(seqs, batch_size=batch, seed=4, epoch=1, rank=rank, world_size=world)

    reference = list(adapter())
    assert len(reference) == len(seqs) // (world * batch) == len(adapter())
    dl = loader(adapter(), workers, every=every)
    k = int(stop * len(reference))
    it = iter(dl)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(dl.state_dict()))
    tail = list(it)
    assert same(head + tail, reference)  # the same batches for any num_workers
    resumed = loader(adapter(), workers, every=every)
    resumed.load_state_dict(state)
    assert same(list(resumed), tail)
    assert global_position(state)["position"] == k * world * batch


def test_elastic_start_covers_the_rest_once(seqs):
    """Saved at 3 ranks x 2 workers, resumed at 2 ranks x 1 worker with another batch size."""
    def first_rows(batch: dict) -> list[int]:  # a sequence is named by its tokens
        return [names[tuple(r.tolist())] for r in batch["tokens"]]

    names = {tuple(seqs[i]["tokens"].tolist()): i for i in range(len(seqs))}
    assert len(names) == len(seqs)
    states, before = [], []
    for rank in range(3):
        dl = loader(PackedBatches(seqs, batch_size=2, seed=7, rank=rank, world_size=3), 2)
        it = iter(dl)
        before += [i for _ in range(5) for i in first_rows(next(it))]
        states.append(dl.state_dict())
        del it, dl
    pos = global_position(states)
    assert pos["position"] == 5 * 3 * 2
    after = [i for rank in range(2) for b in loader(PackedBatches(seqs, batch_size=3, seed=7, rank=rank,
                                                                  world_size=2, start=pos), 1)
             for i in first_rows(b)]
    order = shardsmith.kit.order.epoch_order(len(seqs), shuffle=True, seed=7, epoch=0)
    assert sorted(before) == sorted(order[:30].tolist())
    end = 30 + (len(seqs) - 30) // 6 * 6
    assert sorted(after) == sorted(order[30:end].tolist())


@pytest.mark.filterwarnings("ignore:mix. sources")
def test_a_recipe_mixes_packed_datasets_and_resumes(seqs, tmp_path, bpe_tokenizer, monkeypatch):
    from shardsmith.loader.mix_recipe import from_recipe

    other = packed(tmp_path / "code", bpe_tokenizer, docs=90, seed=8)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mix.toml").write_text(
        f'[mix]\nseed = 1\nnum_samples = 120\n[mix.sources.web]\npath = "{seqs._shards.out_dir}"\nweight = 0.6\n'
        f'[mix.sources.code]\npath = "code/out"\nweight = 0.4\nloader = "PackedSequences"\n')
    res = run_cli("run", "mix.toml")
    assert res.exit_code == 0, res.stderr
    assert "mixture of 2 sources: 120 samples" in res.output
    m = from_recipe("mix.toml")
    source, sample = m.locate(np.arange(len(m)))
    for k in (0, 7, 119):
        ds = seqs if m.names[source[k]] == "web" else other
        assert np.array_equal(m[k]["tokens"], ds[int(sample[k])]["tokens"])

    def adapter():
        return MixBatches(m, batch_size=5, collate=varlen_collate)

    reference = list(adapter())
    assert reference[0]["cu_seqlens"][-1] == 5 * N
    dl = loader(adapter(), 2)
    it = iter(dl)
    head = [next(it) for _ in range(9)]
    state = dl.state_dict()
    tail = list(it)
    assert same(head + tail, reference)
    resumed = loader(adapter(), 2)
    resumed.load_state_dict(state)
    assert same(list(resumed), tail)


def test_packed_datasets_of_another_length_or_kind_do_not_mix(seqs, tmp_path, bpe_tokenizer):
    from shardsmith.errors import UsageError

    longer = packed(tmp_path / "long", bpe_tokenizer, docs=60, seed=3, seq_len=64)
    with pytest.raises(UsageError, match="another kind of sample"):
        shardsmith.loader.mix({"a": seqs, "b": longer}, {"a": 1, "b": 1}, seed=0)
    docs = shardsmith.loader.TokenDocuments(seqs._shards.out_dir)  # the same shards, read as documents
    with pytest.raises(UsageError, match="another kind of sample"):
        shardsmith.loader.mix({"a": seqs, "b": docs}, {"a": 1, "b": 1}, seed=0)
