"""Parquet events: wide rows with list columns and long rows grouped by a key, checked value by value
against pyarrow reading the same files; events stay whole across row groups, tasks and steps."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsmith.core.events import EventChunk, EventSchema, check_chunk
from shardsmith.core.input_file import InputFile
from shardsmith.demo.icecube_like import make_icecube_kaggle_like
from shardsmith.engine.inputs.files import discover
from shardsmith.errors import DataError, UsageError
from shardsmith.kit.reader import StreamError, Task
from shardsmith.sources.parquet_events import ROWS_COUNTER, ParquetEventReader


def _read_all(reader: ParquetEventReader, files: list[InputFile], schema: EventSchema, *,
              chunk_bytes: int) -> dict[str, list[EventChunk]]:
    """Every chunk of every task, checked, grouped by file."""
    out: dict[str, list[EventChunk]] = {f.rel: [] for f in files}
    for task in reader.plan(files, chunk_bytes=chunk_bytes):
        for chunk in reader.read(task):
            assert isinstance(chunk, EventChunk), chunk
            check_chunk(chunk, schema)
            assert chunk.n > 0
            out[task.file.rel].append(chunk)
    return out


def _events(chunks: list[EventChunk], schema: EventSchema) -> list[dict[str, np.ndarray]]:
    """Per event, every field's values, and check that record numbers run 0, 1, 2… without gaps."""
    events: list[dict[str, np.ndarray]] = []
    for c in chunks:
        assert c.first == len(events)
        events += [c.event(i, schema) for i in range(c.n)]
    return events


def _same(got: np.ndarray, expected: object, f) -> None:
    want = np.asarray(expected, dtype=f.np_dtype)
    assert got.dtype == f.np_dtype and np.array_equal(got, want.reshape(got.shape)), (f.name, got, want)


# -- wide: one row per event ----------------------------------------------------------------

def _wide_table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    la = rng.integers(0, 6, n)  # a and b share lengths, yet stay separate groups
    lc = rng.integers(0, 4, n)
    lj = rng.integers(0, 5, n)
    lm = rng.integers(0, 3, n)

    def lists(lengths, make):
        return [make(int(k)) for k in lengths]

    return pa.table({
        "x": pa.array(rng.normal(size=n)),
        "flag": pa.array(rng.random(n) < 0.5),
        "small": pa.array(rng.integers(-100, 100, n), pa.int8()),
        "v3": pa.array([rng.normal(size=3).astype(np.float32).tolist() for _ in range(n)], pa.list_(pa.float32(), 3)),
        "a": pa.array(lists(la, lambda k: rng.normal(size=k).astype(np.float32).tolist()), pa.list_(pa.float32())),
        "b": pa.array(lists(la, lambda k: rng.integers(0, 1 << 40, k).tolist()), pa.list_(pa.int64())),
        "c": pa.array(lists(lc, lambda k: rng.normal(size=k).tolist()), pa.large_list(pa.float64())),
        "e": pa.array([[] if i % 97 else [int(i)] for i in range(n)], pa.list_(pa.int16())),
        "jets": pa.array(lists(lj, lambda k: [{"pt": float(np.float32(rng.random())), "eta": float(np.float32(rng.normal()))}
                                               for _ in range(k)]),
                         pa.list_(pa.struct([("pt", pa.float32()), ("eta", pa.float32())]))),
        "m": pa.array(lists(lm, lambda k: rng.integers(0, 9, (k, 2)).tolist()), pa.list_(pa.list_(pa.int32(), 2))),
        "met": pa.array([{"pt": float(v), "phi": int(p)} for v, p in zip(rng.random(n), rng.integers(0, 9, n))],
                        pa.struct([("pt", pa.float64()), ("phi", pa.uint16())])),
        "name": pa.array([f"ev{i}" for i in range(n)]),
        "nested": pa.array([[[i], []] for i in range(n)], pa.list_(pa.list_(pa.int32()))),
    })


def _py_value(row: dict, name: str) -> object:
    col, *rest = name.split(".")
    value = row[col]
    if rest:
        value = [v[rest[0]] for v in value] if isinstance(value, list) else value[rest[0]]
    return value


@pytest.mark.parametrize("step_bytes", [1, 3000, 64 << 20])
def test_wide_rows_round_trip_against_pyarrow(tmp_path, step_bytes):
    for i, n in enumerate([700, 333]):
        pq.write_table(_wide_table(n, seed=i), tmp_path / f"part{i}.parquet", row_group_size=61)
    reader = ParquetEventReader(step_bytes=step_bytes)
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    schema, skipped = reader.schema(files)
    assert skipped == ["name", "nested"]
    by = {f.name: f for f in schema.fields}
    assert by["x"].counter is None and by["flag"].dtype == "|b1" and by["v3"].shape == (3,)
    assert by["met.pt"].counter is None and by["met.phi"].dtype == "<u2"
    assert by["a"].counter == "n_a" and by["b"].counter == "n_b" and by["c"].counter == "n_c"
    assert by["jets.pt"].counter == by["jets.eta"].counter == "n_jets"
    assert by["m"].counter == "n_m" and by["m"].shape == (2,)
    chunks = _read_all(reader, files, schema, chunk_bytes=20_000)
    for f in files:
        rows = pq.read_table(f.path).to_pylist()
        if step_bytes == 1:
            assert all(c.n == 1 for c in chunks[f.rel])
        events = _events(chunks[f.rel], schema)
        assert len(events) == len(rows)
        for ev, row in zip(events, rows):
            for fld in schema.fields:
                _same(ev[fld.name], _py_value(row, fld.name), fld)
    # rows cut inside row groups: Arrow slices whose list offsets do not start at 0
    rows = pq.read_table(files[0].path).to_pylist()[13:250]
    chunks = list(reader.read(Task(index=0, file=files[0], start=13, stop=250, first_record=13)))
    assert chunks[0].first == 13 and sum(c.n for c in chunks) == len(rows)
    for c in chunks:
        check_chunk(c, schema)
    events = _events([EventChunk(first=c.first - 13, n=c.n, columns=c.columns, offsets=c.offsets) for c in chunks],
                     schema)
    for ev, row in zip(events, rows):
        for fld in schema.fields:
            _same(ev[fld.name], _py_value(row, fld.name), fld)


def test_wide_tasks_follow_row_groups_and_columns_select(tmp_path):
    pq.write_table(_wide_table(500, seed=3), tmp_path / "a.parquet", row_group_size=50)
    reader = ParquetEventReader(columns=["jets", "x", "m*"])
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    schema, skipped = reader.schema(files)
    assert [f.name for f in schema.fields] == ["x", "jets.pt", "jets.eta", "m", "met.pt", "met.phi"]
    assert skipped == []
    tasks = reader.plan(files, chunk_bytes=1)
    assert [(t.start, t.stop, t.first_record) for t in tasks] == [(r, r + 50, r) for r in range(0, 500, 50)]
    chunks = _read_all(reader, files, schema, chunk_bytes=1)["a.parquet"]
    table = pq.read_table(files[0].path)
    assert np.array_equal(np.concatenate([c.columns["x"] for c in chunks]), table["x"].to_numpy())


def test_wide_values_from_sliced_batches_are_zero_copy(tmp_path):
    pq.write_table(pa.table({"a": pa.array([[1.0, 2.0], [], [3.0]] * 100, pa.list_(pa.float64()))}),
                   tmp_path / "z.parquet", row_group_size=300)
    reader = ParquetEventReader(step_bytes=500)
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    schema, _ = reader.schema(files)
    chunks = _read_all(reader, files, schema, chunk_bytes=1 << 30)["z.parquet"]
    assert len(chunks) > 2
    assert not any(c.columns["a"].flags.owndata for c in chunks)  # views of Arrow's buffers
    assert np.array_equal(np.concatenate([c.columns["a"] for c in chunks]), [1.0, 2.0, 3.0] * 100)


# -- long: rows grouped into events by a key ------------------------------------------------

def _long_table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 6, 80)
    counts[[3, 40]] = [45, 23]  # events spanning several row groups
    ids = np.cumsum(rng.integers(1, 5, len(counts))) + 100
    total = int(counts.sum())
    return pa.table({
        "event_id": pa.array(np.repeat(ids, counts), pa.int32()),  # read as int64
        "t": pa.array(rng.normal(size=total).astype(np.float32)),
        "dom": pa.array(rng.integers(0, 5000, total), pa.int16()),
        "pos": pa.array(rng.normal(size=(total, 3)).astype(np.float32).tolist(), pa.list_(pa.float32(), 3)),
        "ok": pa.array(rng.random(total) < 0.5),
        "label": pa.array(["x"] * total),
        "hits": pa.array([[1, 2]] * total, pa.list_(pa.int8())),
    })


def _groups(table: pa.Table, key: str) -> list[list[dict]]:
    events: list[list[dict]] = []
    for row in table.to_pylist():
        if not events or events[-1][0][key] != row[key]:
            events.append([])
        events[-1].append(row)
    return events


@pytest.mark.parametrize("step_bytes,chunk_bytes", [(1, 1), (700, 1), (1 << 20, 1), (700, 1 << 30)])
def test_long_rows_form_whole_events_across_row_groups_tasks_and_steps(tmp_path, step_bytes, chunk_bytes):
    table = _long_table(0)
    pq.write_table(table, tmp_path / "hits.parquet", row_group_size=7)
    reader = ParquetEventReader(group_by="event_id", step_bytes=step_bytes)
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    schema, skipped = reader.schema(files)
    assert skipped == ["label", "hits"]
    assert [(f.name, f.counter) for f in schema.fields] == [
        ("event_id", None), ("t", ROWS_COUNTER), ("dom", ROWS_COUNTER), ("pos", ROWS_COUNTER), ("ok", ROWS_COUNTER)]
    assert schema["event_id"].dtype == "<i8" and schema["pos"].shape == (3,)
    tasks = reader.plan(files, chunk_bytes=chunk_bytes)
    keys = table["event_id"].to_numpy()
    for t in tasks:  # tasks begin on event boundaries and know the ordinal of their first event
        assert t.start == 0 or keys[t.start - 1] != keys[t.start]
        assert t.first_record == len(np.unique(keys[:t.start]))
    if chunk_bytes == 1:
        assert len(tasks) > 10
    expected = _groups(table, "event_id")
    events = _events(_read_all(reader, files, schema, chunk_bytes=chunk_bytes)["hits.parquet"], schema)
    assert len(events) == len(expected) == 80
    for ev, rows in zip(events, expected):
        assert ev["event_id"] == rows[0]["event_id"]
        for fld in schema.ragged:
            _same(ev[fld.name], [r[fld.name] for r in rows], fld)


def test_long_rows_grouped_but_not_sorted_are_fine(tmp_path):
    keys = [9, 9, 3, 3, 3, 7, 1, 1]
    pq.write_table(pa.table({"event_id": keys, "q": np.arange(8.0)}), tmp_path / "g.parquet", row_group_size=3)
    reader = ParquetEventReader(group_by="event_id", step_bytes=1)
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    schema, _ = reader.schema(files)
    events = _events(_read_all(reader, files, schema, chunk_bytes=1)["g.parquet"], schema)
    assert [int(e["event_id"]) for e in events] == [9, 3, 7, 1]
    assert [e["q"].tolist() for e in events] == [[0, 1], [2, 3, 4], [5], [6, 7]]


def test_icecube_like_batches_join_the_meta_table(tmp_path):
    batches, meta = make_icecube_kaggle_like(tmp_path / "ic", batches=2, events_per_batch=150, mean_pulses=12,
                                             seed=5, row_group_rows=397)
    assert [p.name for p in batches] == ["batch_1.parquet", "batch_2.parquet"]
    again, _ = make_icecube_kaggle_like(tmp_path / "ic2", batches=2, events_per_batch=150, mean_pulses=12,
                                        seed=5, row_group_rows=397)
    assert pq.read_table(again[1]).equals(pq.read_table(batches[1]))
    # a shuffled copy of the meta table: the join must not depend on its order
    mt = pq.read_table(meta)
    shuffled = tmp_path / "meta_shuffled.parquet"
    pq.write_table(mt.take(np.random.default_rng(0).permutation(mt.num_rows)), shuffled, row_group_size=77)
    for table in (meta, shuffled):
        reader = ParquetEventReader(group_by="event_id", events_table=str(table), step_bytes=2000)
        files = discover([str(p) for p in batches], suffixes=reader.suffixes)
        schema, skipped = reader.schema(files)
        assert skipped == []
        assert [f.name for f in schema.fixed] == ["event_id", "batch_id", "first_pulse_index", "last_pulse_index",
                                                  "azimuth", "zenith"]
        assert [f.name for f in schema.ragged] == ["sensor_id", "time", "charge", "auxiliary"]
        chunks = _read_all(reader, files, schema, chunk_bytes=5000)
        for b, f in enumerate(files, start=1):
            got = chunks[f.rel]
            pulses = pq.read_table(f.path)
            want = mt.filter(pa.compute.equal(mt["batch_id"], b))
            counts = np.concatenate([c.counts(ROWS_COUNTER) for c in got])
            firsts = np.concatenate([c.columns["first_pulse_index"] for c in got])
            assert np.array_equal(np.concatenate([c.columns["event_id"] for c in got]), want["event_id"].to_numpy())
            assert np.array_equal(firsts, np.concatenate(([0], np.cumsum(counts)[:-1])))
            assert np.array_equal(np.concatenate([c.columns["last_pulse_index"] for c in got]), firsts + counts - 1)
            for name in ("azimuth", "zenith", "batch_id"):
                assert np.array_equal(np.concatenate([c.columns[name] for c in got]), want[name].to_numpy())
            for name in ("sensor_id", "time", "charge", "auxiliary"):
                flat = np.concatenate([c.columns[name] for c in got])
                assert np.array_equal(flat, pulses[name].to_numpy(zero_copy_only=False))


def test_an_event_missing_from_the_events_table_is_named(tmp_path):
    batches, meta = make_icecube_kaggle_like(tmp_path, batches=1, events_per_batch=40, mean_pulses=5, seed=1)
    mt = pq.read_table(meta)
    gone = int(mt["event_id"][17].as_py())
    pq.write_table(mt.filter(pa.compute.not_equal(mt["event_id"], gone)), meta)
    reader = ParquetEventReader(group_by="event_id", events_table=str(meta))
    files = discover([str(batches[0])], suffixes=reader.suffixes)
    schema, _ = reader.schema(files)
    with pytest.raises(DataError, match=rf"batch_1.parquet: event 18: event_id {gone} is not in the events table"):
        _read_all(reader, files, schema, chunk_bytes=1 << 30)


# -- bad input ------------------------------------------------------------------------------

def test_files_whose_schemas_disagree_are_named(tmp_path):
    pq.write_table(pa.table({"x": pa.array([1.0], pa.float64()), "a": pa.array([[1.0]])}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([1.0], pa.float32()), "a": pa.array([[1.0]])}), tmp_path / "b.parquet")
    reader = ParquetEventReader()
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    with pytest.raises(DataError, match=r"^b\.parquet: .*differ from those of a\.parquet.*'x' is <f4 here, <f8 there"):
        reader.schema(files)
    reader.schema(files[:1])
    task = reader.plan(files[1:], chunk_bytes=1 << 30)[0]
    with pytest.raises(DataError, match=r"^b\.parquet: .*differ"):
        list(reader.read(task))


def test_a_key_that_comes_back_is_named_by_row(tmp_path):
    pq.write_table(pa.table({"event_id": [1, 1, 2, 2, 1, 3], "q": np.arange(6.0)}), tmp_path / "u.parquet",
                   row_group_size=2)
    reader = ParquetEventReader(group_by="event_id")
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    reader.schema(files)
    with pytest.raises(DataError, match=r"u\.parquet: row 5: event_id 1 comes back .*first seen at row 1.*"
                                        r"sorted or grouped by event_id"):
        reader.plan(files, chunk_bytes=1)


def test_column_globs_and_group_by_must_match(tmp_path):
    pq.write_table(pa.table({"x": [1.0], "name": ["a"]}), tmp_path / "c.parquet")
    files = discover([str(tmp_path)], suffixes=(".parquet",))
    with pytest.raises(UsageError, match=r"c\.parquet: --columns 'nope\*' matches no column \(columns: x, name\)"):
        ParquetEventReader(columns=["x", "nope*"]).schema(files)
    with pytest.raises(DataError, match=r"no numeric columns to read \(skipped: name\)"):
        ParquetEventReader(columns=["name"]).schema(files)
    with pytest.raises(UsageError, match=r"--group-by 'event_id': no such column"):
        ParquetEventReader(group_by="event_id").schema(files)
    with pytest.raises(UsageError, match="--group-by"):
        ParquetEventReader(events_table=str(files[0].path))


def test_a_null_number_is_named_by_row(tmp_path):
    pq.write_table(pa.table({"a": pa.array([[1.0], [2.0, None], [3.0]])}), tmp_path / "n.parquet")
    reader = ParquetEventReader()
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    schema, _ = reader.schema(files)
    with pytest.raises(DataError, match=r"n\.parquet: row 2: column 'a' holds a null"):
        _read_all(reader, files, schema, chunk_bytes=1 << 30)


def test_a_truncated_file_is_named(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(_long_table(1), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    reader = ParquetEventReader(group_by="event_id")
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    with pytest.raises(DataError, match=r"^t\.parquet: not a readable Parquet file"):
        reader.schema(files)
    with pytest.raises(DataError, match=r"^t\.parquet: not a readable Parquet file"):
        reader.plan(files, chunk_bytes=1 << 30)


def test_a_corrupt_page_ends_the_task_with_a_stream_error(tmp_path):
    path = tmp_path / "k.parquet"
    table = _long_table(2)
    pq.write_table(table, path, row_group_size=40, write_page_checksum=True)
    md = pq.ParquetFile(path).metadata
    col = md.row_group(3).column(1)  # column "t" of the fourth row group; the key stays readable
    data = bytearray(path.read_bytes())
    at = col.data_page_offset + col.total_compressed_size // 2
    data[at:at + 8] = bytes(b ^ 0xFF for b in data[at:at + 8])
    path.write_bytes(bytes(data))
    reader = ParquetEventReader(group_by="event_id", step_bytes=1)
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    schema, _ = reader.schema(files)
    out = [x for t in reader.plan(files, chunk_bytes=1 << 30) for x in reader.read(t)]
    assert isinstance(out[-1], StreamError) and "row group" in out[-1].reason
    assert all(isinstance(c, EventChunk) for c in out[:-1])
    events = _events(out[:-1], schema)
    expected = _groups(table, "event_id")
    assert 0 < len(events) < len(expected)
    assert sum(len(e["t"]) for e in events) <= 120  # nothing from the corrupt row group or after it
    for ev, rows in zip(events, expected):
        assert ev["t"].tolist() == pytest.approx([r["t"] for r in rows])
