"""TokenDataset / TokenDocuments: windows, batches, rank splits, exact resume, document boundaries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_docs, run_cli, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsmith
from shardsmith.kit.order import epoch_order


@pytest.fixture(scope="module")
def packed(tmp_path_factory, bpe_tokenizer) -> Path:
    """Three shards (rollover at 1500 tokens), so windows cross shard boundaries."""
    tmp = tmp_path_factory.mktemp("packed")
    write_jsonl(tmp / "in" / "a.jsonl", make_docs(200, seed=11))
    res = run_cli("pack-tokens", tmp / "in", "-o", tmp / "out", "--tokenizer", bpe_tokenizer, "--quiet",
                  "--shard-tokens", "1500", "--seq-len", "16")
    assert res.exit_code == 0, res.stderr
    return tmp / "out"


def stream(out: Path) -> np.ndarray:
    m = json.loads((out / "manifest.json").read_text())
    return np.concatenate([np.fromfile(out / s["path"], dtype=np.uint16) for s in m["splits"]["train"]["shards"]])


def test_windows_follow_megatrons_convention(packed):
    ds = shardsmith.TokenDataset(packed)  # seq_len from the manifest
    tokens = stream(packed).astype(np.int64)
    assert len(json.loads((packed / "manifest.json").read_text())["splits"]["train"]["shards"]) >= 3
    assert ds.seq_len == 16 and len(ds) == (len(tokens) - 1) // 16
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.dtype == np.int64 and x.shape == (16,)
        assert np.array_equal(x, tokens[i * 16:i * 16 + 16]) and np.array_equal(y, tokens[i * 16 + 1:i * 16 + 17])
    x, y = ds[-1]
    assert np.array_equal(y, tokens[(len(ds) - 1) * 16 + 1:len(ds) * 16 + 1])


def test_get_batch_equals_single_windows(packed):
    ds = shardsmith.TokenDataset(packed, seq_len=40)
    idx = np.random.default_rng(0).integers(0, len(ds), 64)
    x, y = ds.get_batch(idx)
    assert x.shape == y.shape == (64, 40)
    for row, i in enumerate(idx):
        xi, yi = ds[int(i)]
        assert np.array_equal(x[row], xi) and np.array_equal(y[row], yi)
    with pytest.raises(IndexError):
        ds.get_batch([len(ds)])


def test_rank_slices_are_disjoint_equal_and_cover(packed):
    ds = shardsmith.TokenDataset(packed)
    seen = []
    for rank in range(3):
        it = ds.iter(shuffle=True, seed=4, epoch=2, rank=rank, world_size=3)
        seen.append(sum(1 for _ in it))
    assert len(set(seen)) == 1 and seen[0] == len(ds) // 3
    orders = [epoch_order(len(ds), shuffle=True, seed=4, epoch=2, rank=r, world_size=3) for r in range(3)]
    allidx = np.concatenate(orders)
    assert len(np.unique(allidx)) == len(allidx) == len(ds) - len(ds) % 3


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 500), world=st.integers(1, 8), seed=st.integers(0, 10**6), epoch=st.integers(0, 50))
def test_epoch_order_property(n, world, seed, epoch):
    parts = [epoch_order(n, shuffle=True, seed=seed, epoch=epoch, rank=r, world_size=world) for r in range(world)]
    assert all(len(p) == n // world for p in parts)
    allidx = np.concatenate(parts) if parts else np.zeros(0)
    assert len(np.unique(allidx)) == len(allidx)
    assert np.all((allidx >= 0) & (allidx < max(n, 1)))
    again = epoch_order(n, shuffle=True, seed=seed, epoch=epoch, rank=0, world_size=world)
    assert np.array_equal(again, parts[0])


def test_epochs_differ_and_no_shuffle_is_in_order(packed):
    ds = shardsmith.TokenDataset(packed)
    a = epoch_order(len(ds), shuffle=True, seed=0, epoch=0)
    b = epoch_order(len(ds), shuffle=True, seed=0, epoch=1)
    assert not np.array_equal(a, b) and sorted(a) == sorted(b)
    assert np.array_equal(epoch_order(len(ds), shuffle=False, seed=0, epoch=0), np.arange(len(ds)))


def test_exact_mid_epoch_resume(packed):
    ds = shardsmith.TokenDataset(packed)
    full = [x for x, _ in ds.iter(seed=1, epoch=3, batch_size=5)]
    it = ds.iter(seed=1, epoch=3, batch_size=5)
    head = [next(it)[0] for _ in range(4)]
    state = json.loads(json.dumps(it.state_dict()))  # survives a JSON checkpoint
    resumed = ds.iter(seed=1, epoch=3, batch_size=5)
    resumed.load_state_dict(state)
    rest = [x for x, _ in resumed]
    assert len(head) + len(rest) == len(full) == len(it)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, full))
    with pytest.raises(ValueError, match="seed"):
        ds.iter(seed=2, epoch=3, batch_size=5).load_state_dict(state)


def test_cu_seqlens_mark_document_ends(packed):
    ds = shardsmith.TokenDataset(packed)
    docs = shardsmith.open(packed)
    eos = json.loads((packed / "manifest.json").read_text())["tokenizer"]["eos_id"]
    for i in range(len(ds)):
        x, _ = ds[i]
        cu = ds.cu_seqlens(i)
        assert cu[0] == 0 and cu[-1] == 16 and np.all(np.diff(cu) > 0)
        ends = cu[1:-1]
        assert np.all(x[ends - 1] == eos)  # every inner boundary follows an eos
    assert len(docs) == 200 and all(docs[j][-1] == eos for j in range(len(docs)))


def test_documents_random_access_matches_megatron(packed):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    m = json.loads((packed / "manifest.json").read_text())
    docs = shardsmith.open(packed)
    mega = []
    for s in m["splits"]["train"]["shards"]:
        ds = IndexedDataset(str(packed / s["path"][:-4]))
        mega += [ds[i].astype(np.int64) for i in range(len(ds))]
    assert len(mega) == len(docs)
    assert all(np.array_equal(docs[i], mega[i]) for i in range(len(docs)))


def test_torch_adapters_split_workers_without_duplicates(packed):
    torch = pytest.importorskip("torch")
    import shardsmith.torch as st_torch

    ds = shardsmith.TokenDataset(packed)
    batches = list(st_torch.loader(ds, batch_size=4, shuffle=True, seed=0, num_workers=2, drop_last=False))
    rows = torch.cat([x for x, _ in batches])
    assert rows.dtype == torch.int64 and rows.shape[1] == 16
    starts = {tuple(r.tolist()) for r in rows}
    assert len(rows) == len(ds) and len(starts) == len(ds)  # every window once across both workers
    dropped = list(st_torch.loader(ds, batch_size=4, shuffle=True, seed=0, num_workers=2))  # drop_last by default
    assert [len(x) for x, _ in dropped] == [4] * (len(ds) // 4)
    dl = torch.utils.data.DataLoader(st_torch.TokenWindows(ds), batch_size=8, shuffle=False)
    x, y = next(iter(dl))
    ex, ey = ds.get_batch(np.arange(8))
    assert torch.equal(x, torch.from_numpy(ex)) and torch.equal(y, torch.from_numpy(ey))


def test_missing_manifest_and_wrong_split(tmp_path, packed):
    with pytest.raises(shardsmith.DatasetError, match="no manifest.json"):
        shardsmith.TokenDataset(tmp_path, seq_len=8)
    with pytest.raises(shardsmith.DatasetError, match="no split 'val'"):
        shardsmith.TokenDataset(packed, split="val")
