"""EventDataset, collate_events and the torch adapters over HDF5 event shards."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import orjson
import pytest
import test_hdf5_writer as hw

import shardsmith
from shardsmith.errors import DatasetError, install_hint
from shardsmith.formats.hdf5.dataset import EventBatch, EventDataset, event_order
from shardsmith.kit.collate import collate_events

N = 700


@pytest.fixture(scope="module")
def events() -> dict[str, object]:
    return {"train": hw.make_events(N, seed=10), "val": hw.make_events(37, seed=11)}


@pytest.fixture(scope="module", params=["none", "gzip"])
def dataset(request, tmp_path_factory, events) -> Path:
    """Train in several shards (rollover at 128 events), val in one; uncompressed (mapped) and gzip (h5py)."""
    out = tmp_path_factory.mktemp(f"events-{request.param}")
    return hw.write_dataset(out, events, shard_samples=128, compression=request.param)


def same_event(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        assert np.array_equal(got[name], want[name]), name


def test_open_returns_event_dataset_and_every_event_round_trips(dataset, events):
    ds = shardsmith.open(dataset)
    assert isinstance(ds, EventDataset) and len(ds) == N and len(ds.shard_paths) == 6
    for i in range(N):
        same_event(ds[i], events["train"].event(i, hw.SCHEMA))
    same_event(ds[-1], events["train"].event(N - 1, hw.SCHEMA))
    val = shardsmith.open(dataset, split="val")
    assert len(val) == 37
    same_event(val[36], events["val"].event(36, hw.SCHEMA))
    with pytest.raises(IndexError):
        ds[N]


def test_get_batch_in_any_order_with_repeats(dataset, events):
    ds = EventDataset(dataset)
    rng = np.random.default_rng(0)
    for idx in (rng.integers(0, N, 256), np.array([5, 5, 4, 127, 128, 129, -1, 0]), np.arange(100, 400),
                np.array([20, 3, 3, 100, 50]), np.array([3, 2, 1]), np.array([], dtype=np.int64),
                np.arange(130, 250), np.arange(256, 384), np.array([N - 1]), np.arange(-5, 0)):  # windows
        batch = ds.get_batch(idx)
        assert isinstance(batch, EventBatch) and len(batch) == len(idx)
        assert batch.fixed["pos"].shape == (len(idx), 3)
        assert batch.ragged["hit_t"].offsets is batch.ragged["hit_xyz"].offsets  # one per counter
        for k, i in enumerate(idx):
            same_event(batch.event(k), events["train"].event(int(i) % N, hw.SCHEMA))
        assert np.array_equal(batch.lengths("nhit"), np.diff(events["train"].offsets["nhit"])[idx % N])
        assert all(col.flags.writeable for col in batch.fixed.values())
    with pytest.raises(IndexError):
        ds.get_batch([0, N])


@pytest.mark.parametrize("populate", [True, False])
def test_random_batches_of_long_events_from_mapped_shards(tmp_path, populate):
    """Events of hundreds of values: a random batch copies one slice per event and field out of
    the memory maps (every page mapped up front, or faulted in page by page), equal to the events."""
    long = hw.make_events(300, seed=12, max_hits=400)
    out = hw.write_dataset(tmp_path / "long", {"train": long}, shard_samples=64)
    ds = EventDataset(out)
    ds._populate = populate
    rng = np.random.default_rng(1)
    for idx in (rng.permutation(300)[:128], np.array([299, 0, 64, 64, 63, 5]), rng.integers(0, 300, 40)):
        batch = ds.get_batch(idx)
        for k, i in enumerate(idx):
            same_event(batch.event(k), long.event(int(i), hw.SCHEMA))
        assert batch.ragged["hit_t"].values.flags.writeable
    assert all(s.populated == populate for s in ds._open if s is not None)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_repeated_and_reordered_runs_of_long_events_with_shaped_values(tmp_path, compression):
    """Few runs read then put in the requested order (repeats, out of order): events of hundreds
    of (3,)-shaped hits come back whole (a slice per record once counted elements, not rows)."""
    long = hw.make_events(40, seed=13, max_hits=1200)
    out = hw.write_dataset(tmp_path / "long", {"train": long}, shard_samples=16, compression=compression)
    ds = EventDataset(out)
    idx = np.array([7, 7, 3, 4, 5, 20, 19, 19])
    batch = ds.get_batch(idx)
    for k, i in enumerate(idx):
        same_event(batch.event(k), long.event(int(i), hw.SCHEMA))


def test_lengths_come_from_offsets(dataset, events):
    ds = EventDataset(dataset)
    for c in ("nhit", "njet"):
        assert np.array_equal(ds.lengths(c), np.diff(events["train"].offsets[c]))
    assert (ds.lengths("nhit") == 0).sum() > 50
    with pytest.raises(KeyError):
        ds.lengths("hit_t")


def test_block_shuffle_is_a_permutation_of_contiguous_blocks():
    orders = [event_order(1000, shuffle=True, seed=3, epoch=e, block=64) for e in (0, 1)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(1000))
        # every batch of 64 in the order is one contiguous stretch (modulo n: one wraps around the
        # end), and the one short block comes last, so batches of a block never straddle two
        for a in range(0, 1000, 64):
            steps = np.diff(order[a:a + 64]) % 1000
            assert (steps == 1).all(), (a, order[a:a + 64])
    assert orders[0][-1] != orders[1][-1], "the rotation moves the short block (and the ranks' dropped tail)"
    assert not np.array_equal(orders[0], orders[1])
    exact = event_order(1000, shuffle=True, seed=3, epoch=0, exact=True)
    assert sorted(exact.tolist()) == list(range(1000)) and np.sum(np.diff(exact) == 1) < 20
    assert np.array_equal(event_order(10, shuffle=False, seed=0, epoch=0), np.arange(10))


@pytest.mark.parametrize("exact", [False, True])
def test_rank_shares_are_disjoint_and_equal(exact):
    """The loader's layout over ``event_order``: equal shares, no event twice, and in block mode each
    rank's batch of a block is one contiguous stretch (its reads stay contiguous)."""
    from shardsmith.kit.rank_split import EpochLayout, EpochOrder

    order = EpochOrder(None if exact else 32)(1003, shuffle=True, seed=1, epoch=2)
    layouts = [EpochLayout(total=1003, start=0, batch_size=32, rank=r, world_size=4, drop_last=True) for r in range(4)]
    shares = [order[lay.positions_of(range(lay.steps))] for lay in layouts]
    assert {len(s) for s in shares} == {7 * 32}  # 1003 // (4 × 32) whole steps each
    union = np.concatenate(shares)
    assert len(np.unique(union)) == len(union) == 4 * 7 * 32
    if not exact:  # each batch of a rank is one block: one contiguous read (modulo n)
        for share in shares:
            assert all((np.diff(share[a:a + 32]) % 1003 == 1).all() for a in range(0, len(share), 32))
    with pytest.raises(ValueError):
        EpochLayout(total=10, start=0, batch_size=None, rank=4, world_size=4, drop_last=False)


def test_iter_visits_the_order_and_resumes_exactly(dataset, events):
    ds = EventDataset(dataset)
    it = ds.iter(seed=5, epoch=1, batch_size=50, block=32)
    order = event_order(N, shuffle=True, seed=5, epoch=1, block=32)
    first = [next(it) for _ in range(3)]
    state = it.state_dict()
    rest = list(it)
    assert sum(len(b) for b in first + rest) == N
    seen = np.concatenate([b.fixed["run"] for b in first + rest])
    assert np.array_equal(seen, events["train"].columns["run"][order])
    again = ds.iter(seed=5, epoch=1, batch_size=50, block=32)
    again.load_state_dict(state)
    resumed = list(again)
    assert len(resumed) == len(rest)
    for a, b in zip(resumed, rest):
        assert np.array_equal(a.ragged["hit_xyz"].values, b.ragged["hit_xyz"].values)
    with pytest.raises(ValueError, match="block"):
        ds.iter(seed=5, epoch=1, batch_size=50, block=64).load_state_dict(state)
    singles = list(ds.iter(shuffle=True, exact=True, rank=1, world_size=3))
    assert len(singles) == N // 3
    want = event_order(N, shuffle=True, seed=0, epoch=0, exact=True)[1::3]  # single events: a stride
    same_event(singles[7], events["train"].event(int(want[7]), hw.SCHEMA))


def test_collate_pad_and_flat_with_truncation(dataset):
    ds = EventDataset(dataset)
    empty = int(np.flatnonzero(ds.lengths("nhit") == 0)[0])
    idx = np.array([3, empty, 600, 17, 250, 9])
    batch = ds.get_batch(idx)
    counts = batch.lengths("nhit")
    assert counts[1] == 0 and counts.max() > 5
    pad = collate_events(batch)
    width = int(counts.max())
    assert pad["hit_xyz"].shape == (6, width, 3) and pad["mask"]["nhit"].shape == (6, width)
    assert np.array_equal(pad["mask"]["nhit"].sum(1), counts)
    assert pad["pos"].shape == (6, 3) and pad["flag"].dtype == bool
    for k in range(6):
        ev = batch.event(k)
        assert np.array_equal(pad["hit_xyz"][k, :counts[k]], ev["hit_xyz"])
        assert not pad["hit_t"][k, counts[k]:].any()
    cap = 5
    for truncate in ("tail", "head"):
        out = collate_events(batch, max_len=cap, truncate=truncate, pad_value=-1)
        assert out["hit_ch"].shape == (6, cap)
        for k in range(6):
            ev, n = batch.event(k), min(cap, counts[k])
            kept = ev["hit_ch"][:n] if truncate == "tail" else ev["hit_ch"][len(ev["hit_ch"]) - n:]
            assert np.array_equal(out["hit_ch"][k, :n], kept)
            assert (out["hit_ch"][k, n:] == -1).all() and out["mask"]["nhit"][k].sum() == n
        flat = collate_events(batch, ragged="flat", max_len=cap, truncate=truncate)
        kept = np.minimum(counts, cap)
        assert flat["cu_seqlens"]["nhit"].dtype == np.int32
        assert np.array_equal(flat["cu_seqlens"]["nhit"], np.concatenate([[0], np.cumsum(kept)]))
        assert flat["max_seqlen"]["nhit"] == kept.max()
        assert np.array_equal(flat["hit_t"], out["hit_t"][out["mask"]["nhit"]])
    with pytest.raises(ValueError, match="max_len=5"):
        collate_events(batch, max_len=cap, truncate="error")
    flat = collate_events(batch, ragged="flat")
    assert np.array_equal(flat["jet_pt"], batch.ragged["jet_pt"].values)
    from_list = collate_events([ds[int(i)] for i in idx], schema=ds.schema, max_len=8)
    assert all(np.array_equal(from_list[k], v) for k, v in collate_events(batch, max_len=8).items() if k != "mask")
    with pytest.raises(TypeError, match="schema"):
        collate_events([ds[0]])


def test_torch_dataloader_workers_see_every_event_once(dataset, events):
    torch = pytest.importorskip("torch")
    from shardsmith.torch import EventBatches, EventSamples, event_collate

    ds = EventDataset(dataset)
    ds[0]  # files opened in the parent first: the forked workers must open their own
    loader = torch.utils.data.DataLoader(EventSamples(ds), batch_size=64, shuffle=True, num_workers=2,
                                         collate_fn=event_collate(max_len=16))
    runs = []
    for batch in loader:
        assert batch["hit_t"].shape[1] == 16 and batch["mask"]["nhit"].dtype == torch.bool
        runs.append(batch["run"])
    assert sorted(torch.cat(runs).tolist()) == sorted(events["train"].columns["run"].tolist())
    iterable = EventBatches(ds, batch_size=50, seed=1, rank=0, world_size=1, collate=event_collate(ragged="flat"))
    got = [b for b in torch.utils.data.DataLoader(iterable, batch_size=None, num_workers=2)]
    order = event_order(N, shuffle=True, seed=1, epoch=0)
    assert np.array_equal(torch.cat([b["run"] for b in got]).numpy(), events["train"].columns["run"][order])
    assert all(b["cu_seqlens"]["nhit"].dtype == torch.int32 for b in got)
    shares = [np.concatenate([b.fixed["run"] for b in EventBatches(ds, batch_size=64, rank=r, world_size=2)])
              for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == N // 2 and not set(shares[0]) & set(shares[1])


def _corrupt_copy(dataset: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    out.mkdir()
    for p in dataset.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    return out


def _resize_in_manifest(out: Path) -> None:
    """Record the (edited) shards' sizes, so only the edit itself is wrong."""
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            shard["bytes"] = (out / shard["path"]).stat().st_size
    (out / "manifest.json").write_bytes(orjson.dumps(manifest))


def test_corrupt_offsets_raise_dataset_error_naming_the_file(dataset, tmp_path):
    out = _corrupt_copy(dataset, tmp_path)
    with h5py.File(out / "train-000001.h5", "r+") as f:
        off = f["_counters/nhit"]
        off[10] = off[9] - 1  # decreasing
    _resize_in_manifest(out)
    ds = EventDataset(out)
    ds[0]  # shard 0 is fine
    with pytest.raises(DatasetError, match=r"train-000001\.h5.*nhit"):
        ds[130]
    with h5py.File(out / "train-000002.h5", "r+") as f:
        f["_counters/njet"][-1] = 10**6  # end != len(values)
    _resize_in_manifest(out)
    with pytest.raises(DatasetError, match=r"train-000002\.h5.*jet"):
        EventDataset(out).get_batch([300])


def test_links_outside_the_file_are_refused(dataset, tmp_path):
    out = _corrupt_copy(dataset, tmp_path)
    outside = tmp_path / "outside.h5"
    with h5py.File(outside, "w") as f:
        f["run"] = np.arange(128)
    with h5py.File(out / "train-000000.h5", "r+") as f:
        del f["run"]
        f["run"] = h5py.ExternalLink(str(outside), "run")
    _resize_in_manifest(out)
    with pytest.raises(DatasetError, match=r"train-000000\.h5.*'run' is a ExternalLink"):
        EventDataset(out)[0]


def test_manifest_paths_outside_the_folder_are_refused(dataset, tmp_path):
    out = _corrupt_copy(dataset, tmp_path)
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    manifest["splits"]["val"]["shards"][0]["path"] = "../outside/val-000000.h5"
    (out / "manifest.json").write_bytes(orjson.dumps(manifest))
    with pytest.raises(DatasetError, match="not a plain relative path"):
        EventDataset(out, split="val")
    manifest["splits"]["val"]["shards"][0]["path"] = "link.h5"
    (out / "manifest.json").write_bytes(orjson.dumps(manifest))
    os.symlink(dataset / "val-000000.h5", out / "link.h5")
    with pytest.raises(DatasetError, match="leads outside"):
        EventDataset(out, split="val")


def test_a_shard_of_another_schema_is_refused(dataset, tmp_path):
    out = _corrupt_copy(dataset, tmp_path)
    with h5py.File(out / "val-000000.h5", "r+") as f:
        f.attrs["schema"] = '{"other": {"dtype": "<f4", "shape": [], "ragged": false}}'
    with pytest.raises(DatasetError, match=r"val-000000\.h5: missing or not \d+ bytes"):
        EventDataset(out, split="val")
    _resize_in_manifest(out)
    with pytest.raises(DatasetError, match=r"val-000000\.h5: its schema"):
        EventDataset(out, split="val")[0]


def test_a_damaged_compressed_chunk_is_a_dataset_error(dataset, tmp_path):
    out = _corrupt_copy(dataset, tmp_path)
    with h5py.File(out / "train-000003.h5", "r") as f:
        values = f["hit_t/values"]
        if values.compression is None:
            pytest.skip("uncompressed shards have no chunks to damage")
        info = values.id.get_chunk_info(0)
    with open(out / "train-000003.h5", "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * min(64, info.size))
    with pytest.raises(DatasetError, match=r"train-000003\.h5: cannot read '/hit_t/values'"):
        EventDataset(out).get_batch(np.arange(384, 400))


def test_blosc_shards_load_hdf5plugin_when_needed(tmp_path, events):
    pytest.importorskip("hdf5plugin")
    import subprocess
    import sys

    out = hw.write_dataset(tmp_path / "blosc", {"train": events["val"]}, compression="blosc")
    script = ("import sys, numpy as np, shardsmith\n"
              "{block}"
              "ds = shardsmith.open(sys.argv[1])\n"
              "try:\n    print(float(np.sum(ds.get_batch(np.arange(len(ds))).ragged['hit_t'].values)))\n"
              "except shardsmith.DatasetError as e:\n    print(e)\n")
    ok = subprocess.run([sys.executable, "-c", script.format(block=""), str(out)], capture_output=True, text=True)
    assert float(ok.stdout) == pytest.approx(float(np.sum(events["val"].columns["hit_t"])), rel=1e-6), ok.stderr
    blocked = script.format(block="sys.modules['hdf5plugin'] = None\n")
    res = subprocess.run([sys.executable, "-c", blocked, str(out)], capture_output=True, text=True)
    assert "val-000000.h5" not in res.stdout and "train-000000.h5" in res.stdout
    assert "is compressed with HDF5 filter 32001 (blosc), which needs the hdf5plugin package: " \
           f"{install_hint('blosc')}" in res.stdout, res.stdout + res.stderr
