"""``convert --to memmap`` as a user runs it: real ROOT files and Parquet events into N x L x F arrays,
read back with plain ``np.memmap`` + ``json`` exactly as a model's data loader would, and compared
with what uproot and pyarrow read from the inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import root_data, run_cli, tree_digest

from shardsmith.demo.icecube_like import make_icecube_kaggle_like

JETS = ("Jet_Px", "Jet_Py", "Jet_Pz", "Jet_E", "Jet_btag", "Jet_ID")
HZZ_BRANCHES = "Jet_*,MET_px,EventWeight,NJet"


def convert(*args: str | Path) -> dict:
    res = run_cli("convert", *args, "--quiet")
    assert res.exit_code == 0, res.stderr
    out = Path(args[args.index("-o") + 1])
    return json.loads((out / "manifest.json").read_text())


def user_read(out: Path, split: str = "train") -> dict:
    """What a training script does: the JSON, then np.memmap of each file it names (nothing of shardsmith)."""
    meta = json.loads((out / f"{split}.memmap.json").read_text())

    def mapped(entry: dict) -> np.ndarray:
        if not int(np.prod(entry["shape"])):
            return np.zeros(entry["shape"], entry["dtype"])
        return np.memmap(out / entry["path"], dtype=entry["dtype"], mode="r", shape=tuple(entry["shape"]))

    return {"meta": meta, "values": mapped(meta["values"]), "lengths": mapped(meta["lengths"]),
            "counts": mapped(meta["counts"]), "scalars": {k: mapped(e) for k, e in meta["scalars"].items()}}


@pytest.fixture(scope="module")
def hzz() -> dict[str, np.ndarray]:
    """The HZZ jets and event fields as uproot reads them (one array per event for the jets)."""
    import uproot

    with uproot.open(root_data() / "uproot-HZZ.root") as f:
        return f["events"].arrays([*JETS, "NJet", "MET_px", "EventWeight"], library="np")


def expected_rows(truth: dict[str, np.ndarray], fields: tuple[str, ...], length: int, keep: str,
                  dtype: str = "<f4") -> tuple[np.ndarray, np.ndarray]:
    """The padded rows computed event by event in plain Python: the reference for the vectorised writer."""
    n = len(truth[fields[0]])
    rows = np.zeros((n, length, len(fields)), dtype)
    lengths = np.zeros(n, np.int64)
    for i in range(n):
        cols = [np.asarray(truth[f][i]) for f in fields]
        count = len(cols[0])
        if keep == "first":
            pick = np.arange(min(count, length))
        elif keep == "last":
            pick = np.arange(max(0, count - length), count)
        else:
            key = np.asarray(truth[keep.split(":")[1]][i], np.float64)
            ranked = sorted(range(count), key=lambda k: (-(key[k] if key[k] == key[k] else -np.inf), k))
            pick = np.sort(np.asarray(ranked[:length], np.int64))
        lengths[i] = len(pick)
        for j, c in enumerate(cols):
            rows[i, :len(pick), j] = c[pick]
    return rows, lengths


@pytest.mark.parametrize("keep, length, dtype", [("first", 3, "float32"), ("last", 2, "float16"),
                                                 ("top:Jet_E", 2, "float32")])
def test_root_events_read_with_plain_memmap_equal_uproot(hzz, tmp_path, keep, length, dtype):
    out = tmp_path / "mm"
    m = convert(root_data() / "uproot-HZZ.root", "-o", out, "--to", "memmap", "--branches", HZZ_BRANCHES,
                "--max-len", str(length), "--keep", keep, "--dtype", dtype, "--no-shuffle")
    n = len(hzz["NJet"])
    assert m["format"] == "memmap" and m["splits"]["train"]["events"] == n == m["source"]["records"]
    got = user_read(out)
    meta = got["meta"]
    assert meta["values"]["fields"] == list(JETS) and meta["values"]["shape"] == [n, length, len(JETS)]
    assert (out / "train.values.bin").stat().st_size == n * length * len(JETS) * np.dtype(meta["values"]["dtype"]).itemsize
    want, want_len = expected_rows(hzz, JETS, length, keep, dtype=meta["values"]["dtype"])
    np.testing.assert_array_equal(got["lengths"], want_len)
    np.testing.assert_array_equal(got["counts"], [len(j) for j in hzz["Jet_E"]])
    np.testing.assert_array_equal(got["values"], want)  # Jet_ID (bool) is 0.0 / 1.0; padding is 0
    assert meta["truncated_events"] == int((got["counts"] > length).sum()) > 0
    for name in ("NJet", "MET_px", "EventWeight"):  # event-level fields keep their own dtype
        np.testing.assert_array_equal(got["scalars"][name], hzz[name])
        assert got["scalars"][name].dtype == hzz[name].dtype.newbyteorder("<")


def test_shuffled_splits_hold_every_event_once_and_the_loader_agrees(hzz, tmp_path):
    import shardsmith

    out = tmp_path / "mm"
    m = convert(root_data() / "uproot-HZZ.root", "-o", out, "--to", "memmap", "--branches", HZZ_BRANCHES,
                "--max-len", "4", "--split", "train=0.8,val=0.2", "--seed", "3")
    assert sum(s["events"] for s in m["splits"].values()) == len(hzz["NJet"])
    weights = []
    for split in ("train", "val"):
        got = user_read(out, split)
        weights.append(np.asarray(got["scalars"]["EventWeight"]))
        ds = shardsmith.open(out, split=split)
        assert len(ds) == len(got["lengths"]) == m["splits"][split]["events"]
        for i in (0, len(ds) // 2, len(ds) - 1):
            event = ds[i]
            np.testing.assert_array_equal(event["values"], got["values"][i])
            assert event["length"] == got["lengths"][i] and event["count"] == got["counts"][i]
            assert event["scalars"]["MET_px"] == got["scalars"]["MET_px"][i]
        for idx in (np.array([5, 1, 5, len(ds) - 1]), np.arange(3, 40), np.array([-2, -1]), np.array([], int)):
            batch = ds.get_batch(idx)  # scattered with repeats; windows (one slice per array); empty
            for name in ("values", "lengths", "counts"):
                np.testing.assert_array_equal(batch[name], got[name][idx])
                assert batch[name].dtype == got[name].dtype and batch[name].flags.writeable
            np.testing.assert_array_equal(batch["scalars"]["NJet"], got["scalars"]["NJet"][idx])
        idx = np.array([5, 1, 5, len(ds) - 1])
        batch = ds.get_batch(idx)
        assert ds.mask(batch["lengths"]).sum() == batch["lengths"].sum()
        it = ds.iter(shuffle=True, seed=1, batch_size=64)
        first = next(it)
        state = it.state_dict()
        rest = [b["lengths"] for b in it]
        again = ds.iter(shuffle=True, seed=1, batch_size=64)
        again.load_state_dict(state)
        assert all(np.array_equal(a["lengths"], b) for a, b in zip(again, rest, strict=True))
        assert len(first["values"]) == 64
    together = np.sort(np.concatenate(weights))
    np.testing.assert_array_equal(together, np.sort(hzz["EventWeight"]))  # every event once
    assert not np.array_equal(weights[0][:50], hzz["EventWeight"][:50]), "shuffled"
    res = run_cli("verify", out, "--deep")
    assert res.exit_code == 0 and "OK" in res.output, res.output
    res = run_cli("inspect", out)
    assert res.exit_code == 0 and "memmap: N x 4 x 6 float32" in res.output, res.output


@pytest.fixture(scope="module")
def icecube(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    folder = tmp_path_factory.mktemp("icecube-mm")
    return make_icecube_kaggle_like(folder, batches=2, events_per_batch=120, mean_pulses=20, seed=8,
                                    row_group_rows=1200)


def test_parquet_events_read_with_plain_memmap_equal_pyarrow(icecube, tmp_path):
    import pyarrow.parquet as pq

    batches, meta_table = icecube
    out = tmp_path / "mm"
    convert(*batches, "--group-by", "event_id", "--events-table", meta_table, "-o", out, "--to", "memmap",
            "--max-len", "12", "--keep", "top:charge", "--seed", "9")
    got = user_read(out)
    assert got["meta"]["values"]["fields"] == ["sensor_id", "time", "charge", "auxiliary"]
    pulses = {}
    for path in batches:
        t = pq.read_table(path).to_pydict()
        ids = np.asarray(t["event_id"])
        for eid in np.unique(ids):
            rows = ids == eid
            pulses[int(eid)] = {f: np.asarray(t[f])[rows] for f in ("sensor_id", "time", "charge", "auxiliary")}
    angles = {int(e): z for e, z in zip(*(pq.read_table(meta_table).column(c).to_numpy() for c in ("event_id", "zenith")))}
    eids = np.asarray(got["scalars"]["event_id"])
    assert sorted(eids.tolist()) == sorted(pulses) and eids.tolist() != sorted(eids.tolist())
    truth = {f: [pulses[int(e)][f] for e in eids] for f in ("sensor_id", "time", "charge", "auxiliary")}
    want, want_len = expected_rows(truth, ("sensor_id", "time", "charge", "auxiliary"), 12, "top:charge")
    np.testing.assert_array_equal(got["lengths"], want_len)
    np.testing.assert_array_equal(got["values"], want)
    np.testing.assert_array_equal(got["scalars"]["zenith"], [angles[int(e)] for e in eids])


def test_same_bytes_for_any_workers_memory_and_after_a_kill(icecube, tmp_path):
    """~3.5 s: two killed child processes (kill -9 in the scatter, then in the gather) and the rerun."""
    import os
    import signal

    from conftest import run_subprocess

    batches, meta_table = icecube
    args = ["convert", *batches, "--group-by", "event_id", "--events-table", meta_table, "--to", "memmap",
            "--max-len", "8", "--split", "train=0.7,val=0.3", "-q"]
    convert(*args[1:], "-o", tmp_path / "w1", "--workers", "1")
    convert(*args[1:], "-o", tmp_path / "w2", "--workers", "2", "--memory", "64KB", "--step-size", "16KB")
    assert tree_digest(tmp_path / "w1") == tree_digest(tmp_path / "w2")
    small = [*args, "--memory", "64KB", "--workers", "1", "-o", tmp_path / "killed"]
    for point in ("scatter:1", "gather:train:0"):
        res = run_subprocess(*small, env={**os.environ, "SHARDSMITH_CRASH_AT": point})
        assert res.returncode == -signal.SIGKILL, (point, res.stderr)
    assert run_subprocess(*small).returncode == 0
    assert tree_digest(tmp_path / "killed") == tree_digest(tmp_path / "w1")


def test_cluster_stages_make_the_one_process_bytes(icecube, tmp_path):
    batches, meta_table = icecube
    args = ["convert", *batches, "--group-by", "event_id", "--events-table", meta_table, "--to", "memmap",
            "--max-len", "8", "--split", "train=0.7,val=0.3", "--memory", "64KB", "-q"]
    assert run_cli(*args, "-o", tmp_path / "one").exit_code == 0
    for stage, ranks in (("scatter", (0, 1)), ("plan", (0,)), ("gather", (1, 0)), ("finalize", (0,))):
        for rank in ranks:
            res = run_cli(*args, "-o", tmp_path / "staged", "--stage", stage, "--rank", str(rank), "--world-size", "2")
            assert res.exit_code == 0, (stage, rank, res.stderr)
    assert tree_digest(tmp_path / "staged") == tree_digest(tmp_path / "one")


def test_an_unreadable_input_is_skipped_and_named(tmp_path):
    src = (root_data() / "uproot-HZZ.root").read_bytes()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.root").write_bytes(src)
    (tmp_path / "in" / "cut.root").write_bytes(src[: len(src) * 2 // 3])
    m = convert(tmp_path / "in", "-o", tmp_path / "mm", "--to", "memmap", "--branches", "Jet_E", "--max-len", "2",
                "--on-error", "skip")
    assert m["splits"]["train"]["events"] == 2421
    assert [u["file"] for u in m["source"]["unread"]] == ["cut.root"]
