"""``shardsmith convert`` of physics events as a user runs it: Parquet (long layout) and ROOT into HDF5 and tar."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import root_data, run_cli, tree_digest

from shardsmith.demo.icecube_like import make_icecube_kaggle_like

PULSE_FIELDS = ("sensor_id", "time", "charge", "auxiliary")


@pytest.fixture(scope="module")
def icecube(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path, dict[int, dict[str, np.ndarray]]]:
    """Two batch files in the Kaggle layout, the meta table, and every event as the truth to compare with."""
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("icecube")
    batches, meta = make_icecube_kaggle_like(folder, batches=2, events_per_batch=150, mean_pulses=20, seed=5)
    truth: dict[int, dict[str, np.ndarray]] = {}
    meta_table = pq.read_table(meta).to_pydict()
    angles = {eid: (az, zen) for eid, az, zen in zip(meta_table["event_id"], meta_table["azimuth"],
                                                     meta_table["zenith"])}
    for path in batches:
        table = pq.read_table(path)
        ids = table["event_id"].to_numpy()
        cuts = np.flatnonzero(np.diff(ids)) + 1
        for rows in np.split(np.arange(len(ids)), cuts):
            eid = int(ids[rows[0]])
            truth[eid] = {name: table[name].to_numpy()[rows] for name in PULSE_FIELDS}
            truth[eid]["azimuth"], truth[eid]["zenith"] = angles[eid]
    return batches, meta, truth


def convert(*args: str | Path) -> dict:
    res = run_cli("convert", *args, "--quiet")
    assert res.exit_code == 0, res.stderr
    out = Path(args[args.index("-o") + 1])
    return json.loads((out / "manifest.json").read_text())


def icecube_args(batches: list[Path], meta: Path) -> list[str | Path]:
    return [*batches, "--group-by", "event_id", "--events-table", meta]


def test_parquet_events_to_hdf5_round_trip_shuffled(icecube, tmp_path):
    import shardsmith

    batches, meta, truth = icecube
    m = convert(*icecube_args(batches, meta), "-o", tmp_path / "h5", "--to", "hdf5", "--shard-samples", "100")
    assert m["format"] == "hdf5" and m["splits"]["train"]["events"] == len(truth) == m["source"]["records"]
    assert len(m["splits"]["train"]["shards"]) == 3
    ds = shardsmith.open(tmp_path / "h5")
    assert len(ds) == len(truth)
    seen = []
    for i in range(len(ds)):
        event = ds[i]
        eid = int(event["event_id"])
        seen.append(eid)
        for name in PULSE_FIELDS:
            np.testing.assert_array_equal(event[name], truth[eid][name], err_msg=f"{eid} {name}")
        assert event["azimuth"] == truth[eid]["azimuth"] and event["zenith"] == truth[eid]["zenith"]
    assert sorted(seen) == sorted(truth) and seen != sorted(seen), "every event once, shuffled"


def test_event_bytes_do_not_depend_on_workers_or_memory(icecube, tmp_path):
    batches, meta, _ = icecube
    common = [*icecube_args(batches, meta), "--to", "hdf5", "--split", "train=0.8,val=0.2", "--seed", "4"]
    convert(*common, "-o", tmp_path / "w1", "--workers", "1")
    convert(*common, "-o", tmp_path / "w2", "--workers", "2", "--memory", "64KB", "--step-size", "16KB")
    assert tree_digest(tmp_path / "w1") == tree_digest(tmp_path / "w2")


def test_events_in_tar_windows_read_by_webdataset(icecube, tmp_path):
    import webdataset as wds

    import shardsmith

    batches, meta, truth = icecube
    m = convert(*icecube_args(batches, meta), "-o", tmp_path / "tar", "--to", "webdataset",
                "--events-per-sample", "8", "--no-shuffle")
    n = len(truth)
    assert m["splits"]["train"]["samples"] == -(-n // 8) and m["splits"]["train"]["events"] == n
    urls = sorted(str(p) for p in (tmp_path / "tar").glob("train-*.tar"))
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode())
    ids = np.concatenate([s["event_id.npy"] for s in samples])
    assert ids.tolist() == sorted(truth)  # --no-shuffle keeps input order
    ds = shardsmith.open(tmp_path / "tar")
    first = ds[0]
    walked = list(ds.iter(shuffle=True, seed=1))  # iteration yields the same event dicts as ds[i]
    assert len(walked) == len(ds) and sorted(int(w["event_id"][0]) for w in walked) == sorted(
        int(ds[i]["event_id"][0]) for i in range(len(ds)))
    off = first["n_rows.offsets"]
    assert off[0] == 0 and len(off) == 9
    for j, eid in enumerate(first["event_id"].tolist()):
        np.testing.assert_array_equal(first["time"][off[j]:off[j + 1]], truth[eid]["time"])


def test_event_usage_errors(icecube, tmp_path):
    batches, meta, _ = icecube
    res = run_cli("convert", *batches, "-o", tmp_path / "o", "--to", "hdf5", "--events-table", meta)
    assert res.exit_code == 2 and "--group-by" in res.stderr
    res = run_cli("convert", *batches, "-o", tmp_path / "o", "--to", "hdf5", "--group-by", "event_id",
                  "--events-per-sample", "4")
    assert res.exit_code == 2 and "--events-per-sample" in res.stderr
    res = run_cli("convert", *batches, "-o", tmp_path / "o", "--to", "hdf5", "--group-by", "nope")
    assert res.exit_code != 0 and "nope" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("name, tree", [
    ("uproot-HZZ.root", "events"),
    ("Run2012BC_DoubleMuParked_Muons_1000evts_rntuple_v1-0-0-0.root", None),
])
@pytest.mark.parametrize("shuffle", [True, False])
def test_real_root_files_round_trip_through_hdf5(tmp_path, name, tree, shuffle):
    """Every value of every numeric branch comes back through convert + the loader, shuffled or not."""
    import h5py
    import uproot

    import shardsmith

    path = root_data() / name
    out = tmp_path / "h5"
    m = convert(path, "-o", out, "--to", "hdf5", "--shard-samples", "700", *([] if shuffle else ["--no-shuffle"]))
    with uproot.open(path) as f:
        obj = f[tree] if tree else f[next(k for k, c in f.classnames().items() if "RNTuple" in c)]
        truth = obj.arrays(list(m["schema"]), library="ak")
    n = len(truth)
    assert m["splits"]["train"]["events"] == n == m["source"]["records"]
    ds = shardsmith.open(out)
    batch = ds.get_batch(np.arange(n))
    # the shuffle is a permutation; recover it from the h5 files' own provenance-free content by sorting
    order = np.arange(n)
    if shuffle:
        from shardsmith.kit import keys as keymod

        keys = keymod.shuffle_keys(0, name, np.arange(n))
        order = np.lexsort((np.arange(n), keys))
        assert not np.array_equal(order, np.arange(n))
    for field, spec in m["schema"].items():
        import awkward as ak

        want = truth[field][order]
        if spec["ragged"]:
            got = batch.ragged[field]
            np.testing.assert_array_equal(np.diff(got.offsets), ak.num(want, axis=1).to_numpy(), err_msg=field)
            np.testing.assert_array_equal(got.values, ak.flatten(want, axis=1).to_numpy(), err_msg=field)
        else:
            np.testing.assert_array_equal(batch.fixed[field], want.to_numpy(), err_msg=field)
    with h5py.File(next(out.glob("train-*.h5")), "r") as h5:  # self-describing without shardsmith
        assert json.loads(h5.attrs["schema"]) == m["schema"]


def test_root_to_tar_and_bad_root_files(tmp_path):
    import shardsmith

    path = root_data() / "uproot-HZZ.root"
    m = convert(path, "-o", tmp_path / "tar", "--to", "webdataset", "--branches", "Jet_*,NJet,Muon_Px")
    assert set(m["schema"]) == {"NJet", "Jet_Px", "Jet_Py", "Jet_Pz", "Jet_E", "Jet_btag", "Jet_ID", "Muon_Px"}
    ds = shardsmith.open(tmp_path / "tar")
    sample = ds[3]
    assert len(sample["Jet_Px"]) == int(sample["NJet"]) and sample["Jet_Px"].dtype == np.float32
    broken = tmp_path / "broken.root"
    broken.write_bytes(path.read_bytes()[:30_000])
    res = run_cli("convert", broken, "-o", tmp_path / "o", "--to", "hdf5")
    assert res.exit_code == 1 and "broken.root" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = run_cli("convert", path, "-o", tmp_path / "o2", "--to", "hdf5", "--tree", "nope")
    assert res.exit_code != 0 and "nope" in res.stderr and "events" in res.stderr
    res = run_cli("convert", path, "-o", tmp_path / "o3", "--to", "hdf5", "--branches", "Nothing*")
    assert res.exit_code != 0 and "Nothing*" in res.stderr


def test_verify_inspect_and_bench_on_events(icecube, tmp_path):
    import h5py

    batches, meta, truth = icecube
    out = tmp_path / "h5"
    convert(*icecube_args(batches, meta), "-o", out, "--to", "hdf5", "--compression", "gzip")
    res = run_cli("verify", out, "--deep")
    assert res.exit_code == 0 and "OK" in res.output, res.output
    res = run_cli("inspect", out)
    assert res.exit_code == 0 and "counters n_rows" in res.output and "event train[0]" in res.output, res.output
    res = run_cli("bench", out, "--seconds", "0.2")
    assert res.exit_code == 0 and "events/s" in res.output, res.output
    shard = next(out.glob("train-*.h5"))
    with h5py.File(shard, "r+") as h5:  # a decreasing offset: the deep check must name the file
        off = h5["_counters/n_rows"]
        off[5] = off[4] - 1
    res = run_cli("verify", out)
    assert res.exit_code == 1 and "FAIL" in res.output and shard.name in res.output
