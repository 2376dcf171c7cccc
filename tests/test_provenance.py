"""``convert --provenance``: every event carries its input file (an index into the manifest's
``source.inputs``) and its entry in that file, and those lead back to the input's own values, read
with uproot or pyarrow: for ROOT (TTree, RNTuple) and Parquet (wide and ``--group-by``) inputs, into
hdf5 and event tar, with 1 and 2 workers, in cluster stages and across a kill (docs/design.md,
"Provenance of events"; guarantees 2 and 7)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import root_data, run_cli, run_subprocess, tree_digest

import shardsmith
from shardsmith.core.provenance import ENTRY_FIELD, FILE_FIELD
from shardsmith.demo.icecube_like import make_icecube_kaggle_like
from shardsmith.demo.root_files import make_icecube_like
from shardsmith.errors import DatasetError
from shardsmith.kit.event_batch import EventBatch

PROVENANCE = (FILE_FIELD, ENTRY_FIELD)


def _batch(out: Path, split: str) -> tuple[EventBatch, list[str]]:
    """Every event of a split as one batch (hdf5: ``get_batch``; tar: the samples stacked), and the
    input names the loader gives."""
    ds = shardsmith.open(out, split=split)
    if hasattr(ds, "get_batch") and isinstance(ds.get_batch([0]), EventBatch):
        batch = ds.get_batch(np.arange(len(ds)))
    else:
        batch = EventBatch.from_samples([ds[i] for i in range(len(ds))], ds.schema)
    assert ds.inputs is not None
    return batch, ds.inputs


def _got(batch: EventBatch, name: str, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Field ``name`` of the events ``sel``: (values, counts or None)."""
    if name in batch.fixed:
        return batch.fixed[name][sel], None
    r = batch.ragged[name]
    parts = [r[int(k)] for k in sel]
    return (np.concatenate(parts) if parts else r.values[:0]), np.array([len(p) for p in parts])


def _maps_back(out: Path, read: Any, entries_of: dict[str, Any] | None, fields: list[str] | None = None) -> int:
    """Each event of every split equals its input entry (``read(name, entries, field)`` -> (values,
    counts or None)); every input entry is there exactly once. Returns the events checked."""
    manifest = json.loads((out / "manifest.json").read_text())
    seen: list[tuple[int, int]] = []
    for split in manifest["splits"]:
        batch, inputs = _batch(out, split)
        assert inputs == manifest["source"]["inputs"]
        files, entries = batch.fixed[FILE_FIELD], batch.fixed[ENTRY_FIELD]
        assert files.dtype == np.int32 and entries.dtype == np.int64
        seen += list(zip(files.tolist(), entries.tolist()))
        names = fields or [f.name for f in batch.schema.fields if f.name not in PROVENANCE]
        for fi in np.unique(files):
            sel = np.flatnonzero(files == fi)
            for name in names:
                want, want_counts = read(inputs[fi], entries[sel], name)
                got, got_counts = _got(batch, name, sel)
                np.testing.assert_array_equal(got, want, err_msg=f"{split} {inputs[fi]} {name}")
                if want_counts is not None:
                    np.testing.assert_array_equal(got_counts, want_counts)
    inputs = manifest["source"]["inputs"]
    if entries_of is None:  # a subset (--balance): each entry at most once
        assert len(set(seen)) == len(seen)
    else:
        assert sorted(seen) == sorted((i, e) for i, rel in enumerate(inputs) for e in _entries(rel, entries_of))
    return len(seen)


def _entries(rel: str, entries_of: dict[str, Any]) -> Any:
    e = entries_of[rel]
    return range(e) if isinstance(e, int) else e


def _uproot_reader(folder: Path, tree: str | None = None) -> Any:
    import awkward as ak
    import uproot

    cache: dict[str, Any] = {}

    def read(rel: str, entries: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        if rel not in cache:
            f = uproot.open(folder / rel)
            cache[rel] = f[tree] if tree else f[f.keys()[0]]
        arr = cache[rel].arrays([name], library="ak")[name][entries]
        if arr.ndim > 1 and isinstance(ak.type(arr).content, ak.types.ListType):
            return ak.to_numpy(ak.flatten(arr)), ak.to_numpy(ak.num(arr))
        return ak.to_numpy(arr), None

    return read


@pytest.fixture(scope="module")
def root_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small ROOT files of one schema (different values), TTree and RNTuple kinds apart."""
    folder = tmp_path_factory.mktemp("prov-root")
    make_icecube_like(folder / "a.root", events=300, mean_pulses=6, seed=1, events_per_basket=70)
    make_icecube_like(folder / "b.root", events=180, mean_pulses=6, seed=2, events_per_basket=70)
    return folder


@pytest.mark.parametrize("to", ["hdf5", "webdataset"])
@pytest.mark.parametrize("workers", [1, 2])
def test_root_events_map_back_to_their_entries(root_inputs, tmp_path, to, workers):
    out = tmp_path / "out"
    res = run_cli("convert", root_inputs, "-o", out, "--to", to, "--provenance", "--workers", str(workers),
                  "--memory", "256KB", "--split", "train=0.8,val=0.2", "--shard-samples", "100", "-q")
    assert res.exit_code == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["inputs"] == ["a.root", "b.root"]
    assert manifest["events"]["provenance"] == {"file": FILE_FIELD, "entry": ENTRY_FIELD, "entry_is": "entry"}
    assert _maps_back(out, _uproot_reader(root_inputs), {"a.root": 300, "b.root": 180}) == 480
    if workers == 2:  # the same bytes for any worker count
        res = run_cli("convert", root_inputs, "-o", tmp_path / "one", "--to", to, "--provenance", "--workers", "1",
                      "--memory", "256KB", "--split", "train=0.8,val=0.2", "--shard-samples", "100", "-q")
        assert res.exit_code == 0, res.stderr
        assert tree_digest(out) == tree_digest(tmp_path / "one")


@pytest.mark.parametrize("name, to, fields", [
    ("uproot-HZZ.root", "hdf5", None),
    ("Run2012BC_DoubleMuParked_Muons_1000evts_rntuple_v1-0-0-0.root", "webdataset", ["nMuon", "Muon_pt", "Muon_charge"]),
])
def test_real_root_files_map_back(tmp_path, name, to, fields):
    data = root_data()
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / name).symlink_to(data / name)  # a link, not a copy: the real file is read in place
    out = tmp_path / "out"
    res = run_cli("convert", inputs, "-o", out, "--to", to, "--provenance", "--workers", "2", "-q",
                  "--split", "train=0.5,val=0.5")
    assert res.exit_code == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    n = manifest["source"]["records"]
    assert _maps_back(out, _uproot_reader(inputs), {name: n}, fields) == n


def test_balanced_events_keep_their_entries(tmp_path):
    """``--balance`` drops events in the worker before the provenance columns are made."""
    data = root_data()
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "uproot-HZZ.root").symlink_to(data / "uproot-HZZ.root")
    out = tmp_path / "out"
    res = run_cli("convert", inputs, "-o", out, "--to", "hdf5", "--provenance", "--balance", "max=300,label=NJet",
                  "--workers", "2", "-q")
    assert res.exit_code == 0, res.stderr
    kept = sum(json.loads((out / "manifest.json").read_text())["balance"]["after"].values())
    assert kept < 2421
    assert _maps_back(out, _uproot_reader(inputs), None, ["NJet", "Jet_Px", "Muon_E"]) == kept


def _parquet_reader(folder: Path) -> Any:
    cache: dict[str, pa.Table] = {}

    def read(rel: str, entries: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        if rel not in cache:
            cache[rel] = pq.read_table(folder / rel)
        col = cache[rel].column(name).combine_chunks().take(pa.array(entries))
        if pa.types.is_list(col.type):
            return col.flatten().to_numpy(), np.diff(col.offsets.to_numpy())
        return col.to_numpy(), None

    return read


def test_wide_parquet_rows_map_back(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for name, n in (("x.parquet", 400), ("y.parquet", 250)):
        counts = rng.integers(0, 5, n)
        pq.write_table(pa.table({
            "energy": rng.random(n),
            "label": rng.integers(0, 3, n).astype(np.int32),
            "hits": pa.array([list(rng.random(c).astype(np.float32)) for c in counts], pa.list_(pa.float32())),
        }), folder / name, row_group_size=90)
    for to in ("hdf5", "webdataset"):
        out = tmp_path / to
        res = run_cli("convert", folder, "-o", out, "--from", "parquet-events", "--to", to, "--provenance",
                      "--workers", "2", "--memory", "256KB", "--split", "train=0.7,val=0.3", "-q")
        assert res.exit_code == 0, res.stderr
        assert json.loads((out / "manifest.json").read_text())["events"]["provenance"]["entry_is"] == "row"
        assert _maps_back(out, _parquet_reader(folder), {"x.parquet": 400, "y.parquet": 250}) == 650


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    return make_icecube_kaggle_like(tmp_path_factory.mktemp("prov-ic"), batches=2, events_per_batch=150,
                                    mean_pulses=12, seed=4, row_group_rows=700)


def _group_reader(folder: Path) -> Any:
    """A grouped event's entry is its first row: the key there is the event's, the row before holds
    another key, and its hits are the rows from there on."""
    cache: dict[str, pa.Table] = {}

    def read(rel: str, entries: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        if rel not in cache:
            cache[rel] = pq.read_table(folder / rel)
        t = cache[rel]
        key = t.column("event_id").to_numpy()
        assert np.all((entries == 0) | (key[np.maximum(entries - 1, 0)] != key[entries])), "not a first row"
        if name == "event_id":
            return key[entries], None
        ends = np.searchsorted(key, key[entries], side="right")  # the batches are sorted by key
        col = t.column(name).to_numpy()
        return np.concatenate([col[a:b] for a, b in zip(entries, ends)]), ends - entries

    return read


@pytest.mark.parametrize("to", ["hdf5", "webdataset"])
def test_grouped_parquet_events_map_back_to_their_first_row(kaggle, tmp_path, to):
    batches, meta = kaggle
    out = tmp_path / "out"
    res = run_cli("convert", *batches, "--group-by", "event_id", "--events-table", meta, "--to", to, "-o", out,
                  "--provenance", "--workers", "2", "--memory", "256KB", "--split", "train=0.8,val=0.2", "-q")
    assert res.exit_code == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["events"]["provenance"]["entry_is"] == "first row of the event's group"
    firsts = {b.name: np.flatnonzero(np.diff(pq.read_table(b).column("event_id").to_numpy(), prepend=-1)).tolist()
              for b in batches}
    assert _maps_back(out, _group_reader(batches[0].parent), firsts, ["event_id", "time", "charge"]) == 300


def test_provenance_survives_cluster_stages(root_inputs, tmp_path):
    args = ["convert", root_inputs, "--to", "hdf5", "--provenance", "--memory", "256KB", "--split",
            "train=0.8,val=0.2", "--shard-samples", "100", "-q"]
    res = run_cli(*args, "-o", tmp_path / "one")
    assert res.exit_code == 0, res.stderr
    out = tmp_path / "staged"
    for stage, ranks in (("scatter", [0, 1]), ("plan", [0]), ("gather", [1, 0])):
        for rank in ranks:
            res = run_cli(*args, "-o", out, "--stage", stage, "--rank", str(rank), "--world-size", "2")
            assert res.exit_code == 0, res.stderr
    res = run_cli(*args, "-o", out, "--stage", "finalize", "--world-size", "2")
    assert res.exit_code == 0, res.stderr
    assert tree_digest(out) == tree_digest(tmp_path / "one")


def test_provenance_survives_a_kill(kaggle, tmp_path):
    batches, _ = kaggle
    args = ["convert", *batches, "--group-by", "event_id", "--to", "hdf5", "--provenance",
            "--memory", "256KB", "--workers", "1", "--shard-samples", "150", "-q"]
    assert run_subprocess(*args, "-o", tmp_path / "ref").returncode == 0
    for point in ("scatter:1", "gather:train:0"):
        res = run_subprocess(*args, "-o", tmp_path / "out", env={**os.environ, "SHARDSMITH_CRASH_AT": point})
        assert res.returncode == -signal.SIGKILL, (point, res.stderr)
    res = run_subprocess(*args, "-o", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "ref")


def test_provenance_is_refused_where_it_cannot_hold(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": 1}\n')
    res = run_cli("convert", rows, "-o", tmp_path / "o1", "--to", "webdataset", "--provenance")
    assert res.exit_code == 2 and "--provenance applies to events" in res.stderr, res.stderr
    pq.write_table(pa.table({"_entry": np.arange(3), "x": np.ones(3)}), tmp_path / "e.parquet")
    res = run_cli("convert", tmp_path / "e.parquet", "-o", tmp_path / "o2", "--from", "parquet-events", "--to",
                  "hdf5", "--provenance")
    assert res.exit_code == 2 and "'_entry'" in res.stderr and "--columns" in res.stderr, res.stderr
    res = run_cli("convert", tmp_path / "e.parquet", "-o", tmp_path / "o3", "--from", "parquet-events", "--to",
                  "hdf5", "--provenance", "--columns", "x")
    assert res.exit_code == 0, res.stderr


def test_a_manifest_whose_provenance_names_no_field_is_refused(tmp_path):
    pq.write_table(pa.table({"x": np.ones(4)}), tmp_path / "e.parquet")
    out = tmp_path / "o"
    res = run_cli("convert", tmp_path / "e.parquet", "-o", out, "--from", "parquet-events", "--to", "hdf5",
                  "--provenance", "-q")
    assert res.exit_code == 0, res.stderr
    m = json.loads((out / "manifest.json").read_text())
    m["events"]["provenance"]["entry"] = "x"  # a float field
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DatasetError, match="provenance.entry"):
        shardsmith.open(out)


def test_without_provenance_nothing_is_added(root_inputs, tmp_path):
    res = run_cli("convert", root_inputs, "-o", tmp_path / "o", "--to", "hdf5", "-q")
    assert res.exit_code == 0, res.stderr
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert "provenance" not in m["events"] and not set(PROVENANCE) & set(m["schema"])
    assert shardsmith.open(tmp_path / "o").inputs is None


def test_fixed_shape_arrays_carry_provenance_as_event_scalars(tmp_path):
    """--to memmap: ``_file`` and ``_entry`` are two N-row arrays beside the values; each event's
    scalar and first jet values equal uproot's at that entry."""
    import uproot

    name = "uproot-HZZ.root"
    out = tmp_path / "out"
    res = run_cli("convert", root_data() / name, "-o", out, "--to", "memmap", "--max-len", "4",
                  "--branches", "Jet_Px,Jet_Py,EventWeight", "--provenance", "--workers", "2", "-q")
    assert res.exit_code == 0, res.stderr
    ds = shardsmith.open(out)
    assert ds.inputs == [name] and len(ds) == 2421
    with uproot.open(root_data() / name) as f:
        arrays = f["events"].arrays(["Jet_Px", "EventWeight"], library="np")
    batch = ds.get_batch(np.arange(len(ds)))
    entry = batch["scalars"][ENTRY_FIELD]
    assert (batch["scalars"][FILE_FIELD] == 0).all() and sorted(entry.tolist()) == list(range(2421))
    assert np.array_equal(batch["scalars"]["EventWeight"], arrays["EventWeight"][entry])
    px = ds.fields.index("Jet_Px")
    for row, e in enumerate(entry[:200].tolist()):
        jets = arrays["Jet_Px"][e][:4]
        assert np.array_equal(batch["values"][row, :len(jets), px], jets.astype(np.float32))
