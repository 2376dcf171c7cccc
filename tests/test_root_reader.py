"""The ``root`` reader against real ROOT files (TTree and RNTuple): every value of every selected
branch equals what uproot reads directly, however the file is cut into tasks and steps."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import awkward as ak
import numpy as np
import pytest
import uproot
from conftest import root_data

from shardsmith.core.events import EventChunk, EventSchema, Field, check_chunk
from shardsmith.core.input_file import InputFile
from shardsmith.demo.root_files import make_icecube_like
from shardsmith.errors import DataError, UsageError
from shardsmith.kit.reader import StreamError
from shardsmith.sources.root import RootReader, _Leaf, _open, _to_chunk

HZZ = "uproot-HZZ.root"
ZMUMU = "uproot-Zmumu.root"
FLAT = "uproot-small-flat-tree.root"
EVNT = "uproot-small-evnt-tree-fullsplit.root"
DY = "uproot-small-dy-withoffsets.root"
NANO = "nanoAOD_2015_CMS_Open_Data_ttbar.root"
NANO_RNTUPLE = "cmsopendata2015_ttbar_19980_NANOAOD_RNTupleImporter_rntuple_v1-0-0-1.root"
MUONS_RNTUPLE = "Run2012BC_DoubleMuParked_Muons_1000evts_rntuple_v1-0-0-0.root"
EMPTY = "uproot-empty.root"


def _input(path: Path, index: int = 0) -> InputFile:
    return InputFile(path=str(path), rel=path.name, index=index, size=path.stat().st_size)


def _real(name: str) -> InputFile:
    return _input(root_data() / name)


def _collect(reader: RootReader, file: InputFile, schema: EventSchema, *, chunk_bytes: int
             ) -> tuple[int, int, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(tasks, chunks, every column over the whole file, every group's offsets over the whole file)."""
    tasks = reader.plan([file], chunk_bytes=chunk_bytes)
    chunks: list[EventChunk] = []
    pos = 0
    for task in tasks:
        assert task.start == pos == task.first_record
        for chunk in reader.read(task):
            assert not isinstance(chunk, StreamError), chunk
            check_chunk(chunk, schema)
            assert chunk.first == pos and chunk.n > 0
            pos += chunk.n
            chunks.append(chunk)
        assert pos == task.stop
    columns = {f.name: np.concatenate([c.columns[f.name] for c in chunks]) if chunks else None
               for f in schema.fields}
    offsets = {}
    for counter in schema.counters:
        counts = np.concatenate([c.counts(counter) for c in chunks])
        offsets[counter] = np.concatenate([[0], np.cumsum(counts)])
    return len(tasks), len(chunks), columns, offsets


def _uproot_keys(obj) -> dict[str, str]:
    """Output field name -> uproot key: '/' (TTree) or '.' (RNTuple) path separators become '_'."""
    if hasattr(obj, "field_records"):
        return {k.replace(".", "_"): k for k in obj.keys()}  # noqa: SIM118 (uproot keys, not a dict)
    return {k.replace("/", "_"): k for k in obj.keys()}  # noqa: SIM118 (uproot keys, not a dict)


def _compare(file: InputFile, schema: EventSchema, columns: dict[str, np.ndarray],
             offsets: dict[str, np.ndarray]) -> None:
    """Every field equals uproot's own reading, bit for bit (flat: values; jagged: offsets + values).

    uproot reads from the reader's open file (a first look at a wide RNTuple costs uproot seconds),
    through its own names: RNTuple projections (``Jet_pt``) rather than the leaves the reader reads.
    """
    obj, _ = _open(file, None)
    keys = _uproot_keys(obj)
    names = [keys[f.name] for f in schema.fields]
    top = obj.arrays(names, how=dict, array_cache="100 MB")  # projections share their collections
    expected = {}
    for name in names:
        head, *rest = name.split(".") if hasattr(obj, "field_records") else [name]
        arr = top[head]
        for part in rest:
            arr = arr[part]
        expected[name] = arr
    for f in schema.fields:
        want = expected[keys[f.name]]
        got = columns[f.name]
        if f.counter is None:
            want_np = ak.to_numpy(want)
            assert want_np.shape == got.shape, f.name
            # uproot reads an RNTuple cardinality as int64; the reader keeps the declared unsigned type
            assert want_np.dtype == got.dtype or (want_np.dtype == np.int64 and got.dtype.kind == "u"), f.name
            if got.dtype.kind in "iub":
                assert np.array_equal(want_np, got), f.name
            else:
                assert want_np.tobytes() == got.tobytes(), f.name
        else:
            counts = ak.to_numpy(ak.num(want, axis=1))
            assert np.array_equal(np.diff(offsets[f.counter]), counts), f.name
            flat = ak.to_numpy(ak.flatten(want, axis=1))
            assert flat.dtype.newbyteorder("<") == got.dtype, f.name
            assert flat.astype(got.dtype).tobytes() == got.tobytes(), f.name


# -- every value of every real file ---------------------------------------------------------------

CASES = {
    # file: (expected fields, expected skipped, chunk_bytes, step_bytes)
    HZZ: (51, [], 60_000, 20_000),
    ZMUMU: (19, ["Type"], 60_000, 20_000),
    FLAT: (19, ["Str"], 1_000, 2_000),
    EVNT: (36, ["evt/Beg", "evt/Str", "evt/StdStr", "evt/StlVecStr", "evt/End"], 10_000, 3_000),
    DY: (8, [], 5_000, 4_000),
    NANO: (947, [], 400_000, 400_000),
    EMPTY: (2, ["z"], 1 << 20, 1 << 20),
    MUONS_RNTUPLE: (6, [], 10_000, 8_000),
    NANO_RNTUPLE: (947, [], 1 << 20, 20_000),  # last: the next test finds it still open
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_value_equals_uproot(name: str) -> None:
    n_fields, skipped_expected, chunk_bytes, step_bytes = CASES[name]
    file = _real(name)
    reader = RootReader(step_bytes=step_bytes)
    schema, skipped = reader.schema([file])
    assert len(schema.fields) == n_fields
    assert skipped == skipped_expected
    _, n_chunks, columns, offsets = _collect(reader, file, schema, chunk_bytes=chunk_bytes)
    if name == EMPTY:
        assert reader.plan([file], chunk_bytes=chunk_bytes)[0].start == 0
        assert n_chunks == 0
        return
    # these files hold one basket cluster each, which is never split between tasks (the
    # IceCube-like tests below cover many tasks per file)
    assert n_chunks > 2, "the steps should cut every file into several chunks"
    _compare(file, schema, columns, offsets)


def test_nanoaod_default_schema_covers_every_branch_and_matches_its_rntuple() -> None:
    rnt, _ = RootReader().schema([_real(NANO_RNTUPLE)])
    schema, skipped = RootReader().schema([_real(NANO)])
    with uproot.open(_real(NANO).path) as fh:
        assert len(fh["Events"].keys()) == len(schema.fields) == 947 and skipped == []
    assert len(schema.fixed) == 603 and len(schema.ragged) == 344 and len(schema.counters) == 22
    # RNTupleImporter's projections (Jet_pt over _collectionN.Jet_pt) give the same fields and groups
    assert {f.name: f for f in rnt.fields} == {f.name: f for f in schema.fields}


def test_hzz_shared_counters_form_one_group() -> None:
    schema, _ = RootReader().schema([_real(HZZ)])
    assert schema.counters == ("NJet", "NMuon", "NElectron", "NPhoton")
    assert schema["Jet_Px"].counter == schema["Jet_Py"].counter == schema["Jet_ID"].counter == "NJet"
    assert schema["Jet_ID"].dtype == "|b1"  # booleans stay booleans
    assert schema["NJet"] == Field(name="NJet", dtype="<i4")  # the counter branch is a field too
    assert [f.name for f in schema.members("NMuon")] == ["Muon_Px", "Muon_Py", "Muon_Pz", "Muon_E", "Muon_Charge",
                                                          "Muon_Iso"]
    task = RootReader().plan([_real(HZZ)], chunk_bytes=1 << 30)[0]
    chunk = next(iter(RootReader().read(task)))
    assert set(chunk.offsets) == set(schema.counters)
    assert chunk.offsets["NJet"].dtype == np.int64 and chunk.offsets["NJet"][0] == 0


def test_split_objects_fixed_arrays_and_counters() -> None:
    schema, _ = RootReader().schema([_real(EVNT)])
    assert schema["evt_ArrayI16[10]"] == Field(name="evt_ArrayI16[10]", dtype="<i2", shape=(10,))
    assert schema["evt_P3_P3.Px"].dtype == "<i4"  # dotted names under '/' paths
    assert {f.counter for f in schema.fields if f.name.startswith("evt_Slice")} == {"evt_N"}
    assert schema["evt_StlVecF32"].counter == "evt_StlVecF32"  # an STL vector has no count branch
    flat, _ = RootReader().schema([_real(FLAT)])
    assert flat["ArrayFloat64"].shape == (10,) and flat["SliceInt64"].counter == "N"
    dy, _ = RootReader().schema([_real(DY)])
    assert dy.counters == ("nJet", "nMuon") and dy["event"].dtype == "<u8"


def test_rntuple_collections_are_read_once_and_grouped_by_cardinality() -> None:
    schema, _ = RootReader().schema([_real(MUONS_RNTUPLE)])
    assert [f.name for f in schema.fields] == ["Muon_pt", "Muon_eta", "Muon_phi", "Muon_mass", "Muon_charge", "nMuon"]
    assert schema.counters == ("nMuon",) and schema["nMuon"].dtype == "<u4"


# -- selection ----------------------------------------------------------------------------------


def test_branch_globs_select_and_unknown_globs_are_named() -> None:
    reader = RootReader(branches=["Jet_P*", "MET_*"])
    schema, skipped = reader.schema([_real(HZZ)])
    assert [f.name for f in schema.fields] == ["Jet_Px", "Jet_Py", "Jet_Pz", "MET_px", "MET_py"]
    _, _, columns, offsets = _collect(reader, _real(HZZ), schema, chunk_bytes=1 << 20)
    _compare(_real(HZZ), schema, columns, offsets)
    parent, _ = RootReader(branches=["evt/P3"]).schema([_real(EVNT)])  # a parent branch selects its leaves
    assert [f.name for f in parent.fields] == ["evt_P3_P3.Px", "evt_P3_P3.Py", "evt_P3_P3.Pz"]
    with pytest.raises(UsageError) as err:
        RootReader(branches=["Jet_*", "Tau_*"]).schema([_real(HZZ)])
    msg = str(err.value)
    assert HZZ in msg and "'Tau_*'" in msg and "NJet" in msg and "\n" not in msg
    strings, skipped = RootReader(branches=["Type", "M"]).schema([_real(ZMUMU)])
    assert [f.name for f in strings.fields] == ["M"] and skipped == ["Type"]
    with pytest.raises(DataError, match="no numeric branches"):
        RootReader(branches=["Type"]).schema([_real(ZMUMU)])


def test_tree_choice(tmp_path: Path) -> None:
    two = tmp_path / "two.root"
    with uproot.recreate(two) as fh:
        fh.mktree("a", {"x": np.int32}).extend({"x": np.arange(3, dtype=np.int32)})
        fh.mktree("b", {"y": np.float64}).extend({"y": np.ones(2)})
    with pytest.raises(UsageError) as err:
        RootReader().schema([_input(two)])
    assert "two.root" in str(err.value) and "a, b" in str(err.value) and "--tree" in str(err.value)
    with pytest.raises(UsageError) as err:
        RootReader(tree="c").schema([_input(two)])
    assert "--tree 'c'" in str(err.value) and "a, b" in str(err.value)
    reader = RootReader(tree="b")
    schema, _ = reader.schema([_input(two)])
    assert [f.name for f in schema.fields] == ["y"] and reader.tree_name == "b"
    only = RootReader()
    only.schema([_real(HZZ)])
    assert only.tree_name == "events"
    with pytest.raises(UsageError, match="--tree 'Events': no such tree in this file .trees: events."):
        RootReader(tree="Events").schema([_real(HZZ)])


def test_files_with_other_fields_are_named() -> None:
    with pytest.raises(DataError) as err:
        RootReader().schema([_real(HZZ), _input(root_data() / ZMUMU, 1)])
    assert str(err.value).startswith(f"{ZMUMU}: its fields differ from {HZZ}")


# -- bad files ----------------------------------------------------------------------------------


def test_truncated_and_foreign_files_fail_in_one_line(tmp_path: Path) -> None:
    src = Path(_real(HZZ).path).read_bytes()
    truncated = tmp_path / "cut.root"
    truncated.write_bytes(src[: len(src) // 2])
    text = tmp_path / "text.root"
    text.write_text("not a ROOT file at all\n" * 10)
    for bad in (truncated, text):
        with pytest.raises(DataError) as err:
            RootReader().plan([_input(bad)], chunk_bytes=1 << 20)
        msg = str(err.value)
        assert msg.startswith(f"{bad.name}: not a readable ROOT file") and "\n" not in msg, msg
        assert str(tmp_path) not in msg


def test_corrupt_basket_ends_the_task_with_a_stream_error(tmp_path: Path) -> None:
    path = make_icecube_like(tmp_path / "ice.root", events=600, mean_pulses=10, seed=3, events_per_basket=100)
    with uproot.open(path) as fh:
        branch = fh["events"]["pulses_charge"]
        seek = int(branch.member("fBasketSeek")[3])
        key_len = branch.basket_key(3).fKeylen
    raw = bytearray(path.read_bytes())
    raw[seek + key_len + 9: seek + key_len + 400] = b"\x5a" * (400 - 9)  # inside the compressed payload
    path.write_bytes(bytes(raw))
    reader = RootReader(step_bytes=10_000)
    schema, _ = reader.schema([_input(path)])
    task = reader.plan([_input(path)], chunk_bytes=1 << 30)[0]
    out = list(reader.read(task))
    assert isinstance(out[-1], StreamError) and "\n" not in out[-1].reason
    good = out[:-1]
    assert good and all(isinstance(c, EventChunk) for c in good)
    assert sum(c.n for c in good) <= 300  # nothing past the broken basket
    for c in good:
        check_chunk(c, schema)


def test_zlib_baskets_inflate_through_isal_with_uproots_values(tmp_path: Path) -> None:
    """With python-isal installed the reader inflates ZLIB baskets with ISA-L, and every value
    is the one uproot reads with its default zlib; uproot's writing keeps zlib."""
    pytest.importorskip("isal")
    from uproot import compression

    path = make_icecube_like(tmp_path / "ice.root", events=3_000, mean_pulses=20, seed=5, events_per_basket=500)
    with uproot.open(path) as fh:
        assert fh.file.compression.name == "ZLIB"
    inflate = compression._decompress_ZLIB
    before = inflate.library
    inflate.library = "zlib"
    try:
        with uproot.open(path) as fh:
            expected = fh["events"].arrays(["event_id", "pulses_time", "pulses_charge"], library="ak")
        reader = RootReader(step_bytes=50_000)
        schema, _ = reader.schema([_input(path)])
        _, chunks, columns, offsets = _collect(reader, _input(path), schema, chunk_bytes=1 << 30)
        assert inflate.library == "isal"
        assert uproot.ZLIB(1).library == compression._DecompressZLIB.library == "zlib"  # writing untouched
    finally:
        inflate.library = before
    assert chunks > 1
    np.testing.assert_array_equal(columns["event_id"], ak.to_numpy(expected["event_id"]))
    for name in ("pulses_time", "pulses_charge"):
        np.testing.assert_array_equal(columns[name], ak.to_numpy(ak.flatten(expected[name])))
    counter = schema["pulses_time"].counter
    np.testing.assert_array_equal(np.diff(offsets[counter]), ak.to_numpy(ak.num(expected["pulses_time"])))


def test_groups_must_agree() -> None:
    """Two jagged branches that claim one counter but differ in length are a DataError."""
    a = ak.Array([[1.0, 2.0], [3.0]])
    b = ak.Array([[1.0], [3.0, 4.0]])
    leaves = [_Leaf(Field(name=n, dtype="<f8", counter="N"), n, (n,), (n,)) for n in ("a", "b")]
    with pytest.raises(DataError) as err:
        _to_chunk({"a": a, "b": b}, leaves, first=10, file="x.root")
    assert str(err.value).startswith("x.root: entry 11:") and "'N'" in str(err.value)


def test_layouts_other_than_packed_lists() -> None:
    """ListArray (contiguous: zero copy; out of order: re-packed), offsets not at 0, RegularArray."""
    content = ak.contents.NumpyArray(np.arange(10, dtype=np.float32))
    shifted = ak.Array(ak.contents.ListOffsetArray(ak.index.Index64(np.array([3, 5, 5, 9])), content))
    contiguous = ak.Array(ak.contents.ListArray(ak.index.Index64(np.array([3, 5, 5])),
                                                ak.index.Index64(np.array([5, 5, 9])), content))
    shuffled = ak.Array(ak.contents.ListArray(ak.index.Index64(np.array([7, 0, 2])),
                                              ak.index.Index64(np.array([9, 2, 2])), content))
    fixed = ak.Array(ak.contents.RegularArray(content, 2))  # 5 rows of 2
    leaves = [_Leaf(Field(name=n, dtype="<f4", counter=n), n, (n,), (n,)) for n in ("s", "c", "x")]
    chunk = _to_chunk({"s": shifted, "c": contiguous, "x": shuffled}, leaves, first=0, file="f")
    assert chunk.offsets["s"].tolist() == [0, 2, 2, 6] == chunk.offsets["c"].tolist()
    assert chunk.columns["s"].tolist() == [3, 4, 5, 6, 7, 8]
    assert np.shares_memory(chunk.columns["c"], content.data)  # zero copy
    assert chunk.offsets["x"].tolist() == [0, 2, 4, 4] and chunk.columns["x"].tolist() == [7, 8, 0, 1]
    reg = _to_chunk({"r": fixed}, [_Leaf(Field(name="r", dtype="<f4", shape=(2,)), "r", ("r",), ("r",))],
                    first=0, file="f")
    assert reg.n == 5 and reg.columns["r"].shape == (5, 2) and np.shares_memory(reg.columns["r"], content.data)


# -- the synthetic IceCube-like file ---------------------------------------------------------------


@pytest.mark.parametrize("rntuple", [False, True])
def test_icecube_like_round_trip(tmp_path: Path, rntuple: bool) -> None:
    path = make_icecube_like(tmp_path / "ice.root", events=2_000, mean_pulses=30, seed=7, rntuple=rntuple,
                             events_per_basket=500)
    file = _input(path)
    reader = RootReader(step_bytes=100_000)
    schema, skipped = reader.schema([file])
    pulses = ["pulses_time", "pulses_charge", "pulses_dom_x", "pulses_dom_y", "pulses_dom_z", "pulses_auxiliary"]
    assert [f.name for f in schema.fields] == ["event_id", "azimuth", "zenith", "n_pulses", *pulses]
    assert skipped == [] and len(schema.counters) == 1
    assert schema.counters == (("pulses",) if rntuple else ("n_pulses",))
    assert schema["pulses_auxiliary"].dtype == "|b1" and schema["event_id"].dtype == "<i8"
    n_tasks, n_chunks, columns, offsets = _collect(reader, file, schema, chunk_bytes=400_000)
    assert n_tasks > 1 and n_chunks > n_tasks
    assert np.array_equal(columns["event_id"], np.arange(2_000))
    assert np.array_equal(np.diff(offsets[schema.counters[0]]), columns["n_pulses"])
    _compare(file, schema, columns, offsets)
    with uproot.open(path) as fh:  # written in pieces: several baskets / clusters
        obj = fh["events"]
        pieces = len(obj.cluster_summaries) if rntuple else len(obj["pulses_time"].entry_offsets) - 1
    assert pieces == 4
    # the same seed gives the same values, another seed others
    again = make_icecube_like(tmp_path / "again.root", events=2_000, mean_pulses=30, seed=7, rntuple=rntuple,
                              events_per_basket=500)
    other = make_icecube_like(tmp_path / "other.root", events=2_000, mean_pulses=30, seed=8, rntuple=rntuple,
                              events_per_basket=500)
    _, _, same, _ = _collect(RootReader(), _input(again), schema, chunk_bytes=1 << 30)
    _, _, diff, _ = _collect(RootReader(), _input(other), schema, chunk_bytes=1 << 30)
    assert all(np.array_equal(same[n], columns[n]) for n in columns)
    assert not np.array_equal(diff["pulses_time"][:100], columns["pulses_time"][:100])


def test_steps_bound_chunk_sizes(tmp_path: Path) -> None:
    path = make_icecube_like(tmp_path / "ice.root", events=3_000, mean_pulses=50, seed=1, events_per_basket=1_000)
    step = 64_000
    reader = RootReader(step_bytes=step)
    schema, _ = reader.schema([_input(path)])
    task = reader.plan([_input(path)], chunk_bytes=1 << 30)[0]
    sizes = [sum(col.nbytes for col in c.columns.values()) for c in reader.read(task)]
    assert len(sizes) > 20 and max(sizes) < 2 * step


def test_reader_survives_a_copy_of_a_file_at_another_path(tmp_path: Path) -> None:
    """The open-file memo follows the path and mtime: a file replaced in place is read afresh."""
    path = tmp_path / "x.root"
    shutil.copy(_real(DY).path, path)
    first, _ = RootReader().schema([_input(path)])
    shutil.copy(_real(ZMUMU).path, path)
    os.utime(path, ns=(1, 1))
    second, _ = RootReader().schema([_input(path)])
    assert first != second


def test_rntuple_records_and_name_clashes(tmp_path: Path) -> None:
    path = tmp_path / "rec.root"
    data = ak.zip({"p": ak.zip({"x": np.arange(5.0), "v": ak.Array([[1, 2], [], [3], [4, 5, 6], []])}, depth_limit=1),
                   "p_x": np.arange(5)}, depth_limit=1)
    with uproot.recreate(path) as fh:
        fh["t"] = data  # uproot 5.7 writes an RNTuple when a directory item is assigned
    with pytest.raises(DataError) as err:
        RootReader().schema([_input(path)])
    assert "'p.x' and 'p_x' both become field 'p_x'" in str(err.value)
    reader = RootReader(branches=["p"])
    schema, _ = reader.schema([_input(path)])
    assert schema.fields == (Field(name="p_x", dtype="<f8"), Field(name="p_v", dtype="<i8", counter="p_v"))
    _, _, columns, offsets = _collect(reader, _input(path), schema, chunk_bytes=1 << 20)
    assert columns["p_x"].tolist() == [0, 1, 2, 3, 4] and columns["p_v"].tolist() == [1, 2, 3, 4, 5, 6]
    assert offsets["p_v"].tolist() == [0, 2, 2, 3, 6, 6]


def test_the_schema_estimates_the_decoded_bytes_of_the_selected_branches(tmp_path: Path) -> None:
    """The shuffle's buckets are sized by it (``Reader.decoded_bytes``): the selected branches'
    uncompressed bytes from the files' metadata, the same in a process that recalls the schema."""
    files = [_input(make_icecube_like(tmp_path / f"{i}.root", events=800, mean_pulses=20, seed=i,
                                      events_per_basket=200), index=i) for i in range(2)]
    chosen = ["event_id", "pulses_time", "pulses_charge"]
    reader = RootReader(branches=chosen)
    reader.schema(files)
    want = sum(float(uproot.open(f.path)["events"][b].member("fTotBytes")) for f in files for b in chosen)
    assert reader.decoded_bytes() is not None and abs(reader.decoded_bytes() - want) <= 0.05 * want
    every = RootReader()
    every.schema(files)
    assert every.decoded_bytes() > 1.5 * reader.decoded_bytes()  # only what is selected counts
    other = RootReader(branches=chosen)
    other.recall_schema(reader._schema, reader.schema_memo())
    assert other.decoded_bytes() == reader.decoded_bytes()
