"""``convert --to lance`` of physics events: each event one row of a Lance dataset, its scalar
branches typed columns and its jagged branches list columns, that pylance reads back by random
access (``take``) equal to the ROOT file as uproot reads it, in the shuffle's order (the HDF5
output of the same seed); the same bytes for any ``--workers``; verified, inspected, opened."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import root_data, tree_digest

from shardsmith.testing.runs import manifest, run_ok

lance = pytest.importorskip("lance", reason="--to lance needs pylance")
pa = pytest.importorskip("pyarrow")

pytestmark = pytest.mark.filterwarnings("ignore:lance is not fork-safe")

HZZ = "uproot-HZZ.root"  # 2,421 events, jagged jets, muons, electrons, photons


def to_lance(out: Path, *args: str | Path) -> Path:
    run_ok(["convert", *args, "-o", out, "--to", "lance", "--quiet"])
    return out


@pytest.fixture(scope="module")
def hzz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lance_events") / "hzz"
    return to_lance(out, root_data() / HZZ, "--provenance", "--shard-samples", "1000", "--seed", "3")


def test_take_gives_each_event_as_uproot_reads_it(hzz: Path) -> None:
    import uproot

    with uproot.open(root_data() / HZZ) as f:
        tree = f["events"]
        truth = tree.arrays(library="np")
        kinds = {name: b.interpretation for name, b in tree.items()}
    ds = lance.dataset(hzz / "train.lance")
    assert ds.count_rows() == 2421 and len(manifest(hzz)["splits"]["train"]["shards"]) == 3
    schema = ds.schema
    assert schema.field("NJet").type == pa.int32() and schema.field("MET_px").type == pa.float32()
    assert schema.field("Jet_Px").type == pa.list_(pa.float32()) and schema.field("Jet_ID").type == pa.list_(pa.bool_())
    rows = [0, 1, 999, 1000, 1001, 2420, 17]
    entries = []
    for i, row in zip(rows, ds.take(rows).to_pylist()):
        assert row["__key__"] == f"e{i:010d}"
        entry = row["_entry"]
        entries.append(entry)
        for name in truth:
            want = truth[name][entry]
            got = np.asarray(row[name], dtype=np.asarray(want).dtype)
            np.testing.assert_array_equal(got, want, err_msg=f"row {i} (entry {entry}) {name} {kinds[name]}")
    assert entries != sorted(entries), "the shuffle's order"


def test_rows_follow_the_same_shuffle_as_hdf5(hzz: Path, tmp_path: Path) -> None:
    import shardsmith

    common = [root_data() / HZZ, "--seed", "3", "--shard-samples", "1000", "--quiet"]
    run_ok(["convert", *common, "-o", tmp_path / "h5", "--to", "hdf5"])
    plain = to_lance(tmp_path / "plain", root_data() / HZZ, "--seed", "3", "--shard-samples", "1000")
    h5 = shardsmith.open(tmp_path / "h5")
    table = lance.dataset(plain / "train.lance").take([0, 5, 1500, 2420]).to_pylist()
    for i, row in zip([0, 5, 1500, 2420], table):
        for name, want in h5[i].items():
            np.testing.assert_array_equal(np.asarray(row[name], dtype=np.asarray(want).dtype), want, err_msg=name)
    with_entries = lance.dataset(hzz / "train.lance").take([5]).to_pylist()[0]
    assert {k: v for k, v in with_entries.items() if k not in ("_file", "_entry")} == table[1]


def test_verify_inspect_and_open(hzz: Path) -> None:
    import shardsmith

    assert "OK" in run_ok(["verify", hzz, "--deep"]).output
    shown = run_ok(["inspect", hzz]).output
    assert "lance: data files of format" in shown and "counters NJet" in shown
    ds = shardsmith.open(hzz)
    first = lance.dataset(hzz / "train.lance").take([7]).to_pylist()[0]
    assert len(ds) == 2421 and ds[7] == first


@pytest.mark.heavy  # two runs, one of two workers (3 s)
def test_same_bytes_for_one_or_two_workers(tmp_path: Path) -> None:
    from shardsmith.demo.icecube_like import make_icecube_kaggle_like

    batches, meta = make_icecube_kaggle_like(tmp_path / "in", batches=2, events_per_batch=120, mean_pulses=12, seed=5)
    common = [*batches, "--group-by", "event_id", "--events-table", meta, "--split", "train=0.8,val=0.2",
              "--shard-samples", "50"]
    one = to_lance(tmp_path / "w1", *common, "--workers", "1")
    two = to_lance(tmp_path / "w2", *common, "--workers", "2", "--memory", "64KB", "--step-size", "16KB")
    assert tree_digest(one) == tree_digest(two)
    ds = lance.dataset(one / "val.lance")
    assert ds.schema.field("sensor_id").type == pa.list_(pa.int16()) and ds.schema.field("azimuth").type == pa.float64()
    assert ds.count_rows() == manifest(one)["splits"]["val"]["samples"] > 0


def test_fixed_shapes_and_big_endian_fields_are_typed_columns() -> None:
    from shardsmith.core.events import EventChunk, EventSchema, Field
    from shardsmith.formats.lance.events import event_table

    schema = EventSchema(fields=(Field(name="p", dtype="<f4", shape=(3,)), Field(name="x", dtype=">i4"),
                                 Field(name="h", dtype="<f8", shape=(2,), counter="n")))
    chunk = EventChunk(first=0, n=2, columns={"p": np.arange(6, dtype="<f4").reshape(2, 3),
                                              "x": np.array([1, -2], dtype=">i4"), "h": np.arange(6.0).reshape(3, 2)},
                       offsets={"n": np.array([0, 1, 3])})
    table = event_table(chunk, schema, first=4)
    assert table.schema.field("p").type == pa.list_(pa.float32(), 3) and table.schema.field("x").type == pa.int32()
    assert table.schema.field("h").type == pa.list_(pa.list_(pa.float64(), 2))
    assert table.to_pylist() == [{"__key__": "e0000000004", "p": [0, 1, 2], "x": 1, "h": [[0, 1]]},
                                 {"__key__": "e0000000005", "p": [3, 4, 5], "x": -2, "h": [[2, 3], [4, 5]]}]
