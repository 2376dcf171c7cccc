"""``--to memmap`` at the edges: options out of range, inputs it cannot lay out, values a dtype cannot
hold, NaN, and datasets whose JSON lies (refused in one line, never mapped)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import root_data, run_cli

from shardsmith.kit.format import WriteJob
from shardsmith.kit.options import OptionValues

HZZ = "uproot-HZZ.root"


def one_line(res, code: int, *says: str) -> str:
    assert res.exit_code == code, (res.exit_code, res.output, res.stderr)
    err = res.stderr.strip()
    assert "Traceback" not in err, err
    if err.startswith("Usage:"):  # click's own range check: its usage lines, then one error line
        err = err.splitlines()[-1]
    assert len(err.splitlines()) == 1, err
    for s in says:
        assert s in err, (s, err)
    return err


@pytest.mark.parametrize("args, says", [
    ([], ["needs --max-len"]),
    (["--max-len", "0"], ["--max-len"]),
    (["--max-len", "2000000000"], ["one event would take"]),
    (["--max-len", "4", "--keep", "brightest"], ["--keep 'brightest'"]),
    (["--max-len", "4", "--keep", "top:Muon_E"], ["'Muon_E' is not a field of the NJet collection"]),
    (["--max-len", "4", "--dtype", "float64"], ["--dtype"]),
    (["--max-len", "4", "--branches", "Jet_E,Muon_E"], ["one collection", "NJet, NMuon"]),
    (["--max-len", "4", "--branches", "MET_px"], ["none"]),
    (["--max-len", "4", "--events-per-sample", "2"], ["--events-per-sample"]),
], ids=["no max-len", "max-len 0", "huge max-len", "bad keep", "keep of another field", "dtype", "two collections",
        "no collection", "events per sample"])
def test_options_it_cannot_use_are_one_line_usage_errors(tmp_path, args, says):
    branches = [] if "--branches" in args else ["--branches", "Jet_*"]
    res = run_cli("convert", root_data() / HZZ, "-o", tmp_path / "out", "--to", "memmap", *branches, *args, "-q")
    one_line(res, 2, *says)
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("option", [["--max-len", "4"], ["--keep", "last"], ["--dtype", "float16"]])
def test_memmap_options_with_another_format_are_refused_not_ignored(tmp_path, option):
    res = run_cli("convert", root_data() / HZZ, "-o", tmp_path / "out", "--to", "hdf5", *option, "-q")
    one_line(res, 2, f"{option[0]} applies to --to memmap only")


def _long_table(path: Path, charge: list[float], counts: list[int]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = np.repeat(np.arange(len(counts)), counts)
    pq.write_table(pa.table({"event_id": ids, "charge": pa.array(charge, pa.float64()),
                             "time": np.arange(len(ids), dtype=np.int64)}), path)
    return path


def test_float16_overflow_is_refused_and_nan_is_stored(tmp_path):
    src = _long_table(tmp_path / "big.parquet", [1.0, 70000.0, 2.0], [2, 1])
    res = run_cli("convert", src, "--group-by", "event_id", "-o", tmp_path / "h", "--to", "memmap",
                  "--max-len", "2", "--dtype", "float16", "-q")
    one_line(res, 1, "big.parquet: event 1:", "charge", "70000", "float16", "--dtype float32")
    # the encoder refuses the event in the worker: a bad record, which --on-error skip leaves out and lists
    res = run_cli("convert", src, "--group-by", "event_id", "-o", tmp_path / "s", "--to", "memmap",
                  "--max-len", "2", "--dtype", "float16", "--on-error", "skip", "--no-shuffle", "-q")
    assert res.exit_code == 0, res.stderr
    skipped = json.loads((tmp_path / "s" / "manifest.json").read_text())["source"]["skipped"]["records"]
    assert [(s["file"], s["record"]) for s in skipped] == [("big.parquet", 0)] and "70000" in skipped[0]["reason"]
    np.testing.assert_array_equal(np.fromfile(tmp_path / "s" / "train.lengths.bin", "<i8"), [1])  # event 1 alone
    np.testing.assert_array_equal(np.fromfile(tmp_path / "s" / "train.values.bin", "<f2"), [2.0, 2.0, 0, 0])
    src = _long_table(tmp_path / "nan.parquet", [np.nan, 5.0, 1.0, np.inf, 3.0], [3, 2])
    res = run_cli("convert", src, "--group-by", "event_id", "-o", tmp_path / "n", "--to", "memmap",
                  "--max-len", "2", "--keep", "top:charge", "--no-shuffle", "--dtype", "float16", "-q")
    assert res.exit_code == 0, res.stderr
    meta = json.loads((tmp_path / "n" / "train.memmap.json").read_text())
    values = np.memmap(tmp_path / "n" / "train.values.bin", dtype=meta["values"]["dtype"], mode="r",
                       shape=tuple(meta["values"]["shape"]))
    charge = meta["values"]["fields"].index("charge")
    # event 0: NaN ranks below every number, so 5 and 1 are kept in input order; event 1: inf is a value
    np.testing.assert_array_equal(values[:, :, charge], np.array([[5.0, 1.0], [np.inf, 3.0]], np.float16))
    src = _long_table(tmp_path / "first.parquet", [np.nan, 5.0], [2])
    assert run_cli("convert", src, "--group-by", "event_id", "-o", tmp_path / "f", "--to", "memmap",
                   "--max-len", "3", "-q").exit_code == 0
    ds_values = np.fromfile(tmp_path / "f" / "train.values.bin", dtype="<f4").reshape(1, 3, 2)
    assert np.isnan(ds_values[0, 0, 0]) and ds_values[0, 1, 0] == 5.0 and ds_values[0, 2, 0] == 0.0


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "mm"
    res = run_cli("convert", root_data() / HZZ, "-o", out, "--to", "memmap", "--branches", "Jet_*,NJet",
                  "--max-len", "3", "-q")
    assert res.exit_code == 0, res.stderr
    return out


def _rewrite_meta(out: Path, change) -> None:
    """Change the JSON and update the manifest so its sha256 and size vouch for the lie."""
    path = out / "train.memmap.json"
    meta = json.loads(path.read_text())
    change(meta)
    data = json.dumps(meta).encode()
    path.write_bytes(data)
    m = json.loads((out / "manifest.json").read_text())
    entry = {"path": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    m["splits"]["train"]["shards"][0]["arrays"]["meta"] = entry
    m["files"] = [entry if e["path"] == path.name else e for e in m["files"]]
    (out / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("change, says", [
    (lambda m: m["values"].update(shape=[m["values"]["shape"][0], 300, 6]), "needs"),
    (lambda m: m.update(max_len=300), "the manifest says"),
    (lambda m: m["lengths"].update(path="../../etc/passwd"), "does not list"),
    (lambda m: m["scalars"]["NJet"].update(dtype="|O"), "dtype"),
    (lambda m: m["counts"].update(shape=[10]), "needs"),
], ids=["values shape", "max_len", "path outside", "object dtype", "counts shape"])
def test_a_json_that_lies_is_refused_in_one_line(dataset, change, says):
    import shardsmith
    from shardsmith.errors import DatasetError

    _rewrite_meta(dataset, change)
    with pytest.raises(DatasetError, match=says) as exc:
        shardsmith.open(dataset)
    assert "\n" not in str(exc.value)
    for deep in ([], ["--deep"]):  # the JSON is checked without --deep too: it costs no read of the data
        res = run_cli("verify", dataset, *deep)
        assert res.exit_code == 1 and "FAIL" in res.output and says in res.output, res.output


def test_verify_finds_changed_and_cut_arrays(dataset):
    with open(dataset / "train.values.bin", "r+b") as fh:
        fh.seek(12)
        fh.write(b"\x01\x02\x03\x04")
    res = run_cli("verify", dataset)
    assert res.exit_code == 1 and "train.values.bin: sha256" in res.output, res.output
    data = (dataset / "train.lengths.bin").read_bytes()
    (dataset / "train.lengths.bin").write_bytes(data[:-8])
    res = run_cli("verify", dataset)
    assert "train.lengths.bin: " in res.output and "bytes, the manifest says" in res.output, res.output
    import shardsmith
    from shardsmith.errors import DatasetError

    with pytest.raises(DatasetError, match="train.lengths.bin"):
        shardsmith.open(dataset)


def test_padding_past_a_length_is_found_by_verify_deep(dataset):
    """Bytes that change the padding but keep the file's size: verify --deep names the events."""
    import shardsmith

    ds = shardsmith.open(dataset)
    i = int(np.flatnonzero(ds.lengths < 3)[0])
    at = (i * 3 + 2) * 6 * 4
    with open(dataset / "train.values.bin", "r+b") as fh:
        fh.seek(at)
        fh.write(np.float32(7).tobytes())
    problems = shardsmith.open(dataset).check()  # (the one opened before saw the file change: refused)
    assert problems and "past their lengths" in problems[0]


@pytest.mark.parametrize("keep", ["first", "last", "top:k"])
def test_kept_values_equal_a_per_event_reference(keep):
    """The vectorised truncation against the rule said in plain Python: random counts (0 to 3L,
    one event far longer), ties and NaN in the key."""
    from shardsmith.core.events import EventSchema, Field
    from shardsmith.formats.memmap.pad import kept_values
    from shardsmith.formats.memmap.shape import layout_of

    rng = np.random.default_rng(7)
    length = 5
    counts = rng.integers(0, 3 * length, 400)
    counts[3] = 300
    offsets = np.concatenate([[0], np.cumsum(counts)])
    key = rng.integers(0, 6, int(offsets[-1])).astype(np.float64)
    key[rng.random(len(key)) < 0.1] = np.nan
    schema = EventSchema((Field(name="k", dtype="<f8", counter="n"), Field(name="v", dtype="<f4", counter="n")))
    index, lengths = kept_values(offsets, layout_of(schema, max_len=length, dtype="float32", keep=keep), key)
    want: list[int] = []
    for i, c in enumerate(counts.tolist()):
        seg = list(range(int(offsets[i]), int(offsets[i]) + c))
        if keep == "first":
            want += seg[:length]
        elif keep == "last":
            want += seg[max(0, c - length):]
        else:
            rank = sorted(seg, key=lambda j: (-(key[j] if key[j] == key[j] else -np.inf), j))
            want += sorted(rank[:length])
    assert index.tolist() == want
    np.testing.assert_array_equal(lengths, np.minimum(counts, length))


def test_wide_parquet_one_row_per_event(tmp_path):
    """A list column is the collection, the other columns event-level arrays (an empty list: length 0)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    hits = [[1.5, 2.5, 3.5, 4.5], [], [7.0]]
    pq.write_table(pa.table({"label": pa.array([1, 0, 1], pa.int8()), "hits": pa.array(hits, pa.list_(pa.float64()))}),
                   tmp_path / "wide.parquet")
    res = run_cli("convert", tmp_path / "wide.parquet", "-o", tmp_path / "mm", "--to", "memmap", "--max-len", "2",
                  "--keep", "last", "--no-shuffle", "-q")
    assert res.exit_code == 0, res.stderr
    meta = json.loads((tmp_path / "mm" / "train.memmap.json").read_text())
    values = np.fromfile(tmp_path / "mm" / meta["values"]["path"], dtype=meta["values"]["dtype"])
    np.testing.assert_array_equal(values.reshape(meta["values"]["shape"])[:, :, 0], [[3.5, 4.5], [0, 0], [7.0, 0]])
    np.testing.assert_array_equal(np.fromfile(tmp_path / "mm" / "train.lengths.bin", "<i8"), [2, 0, 1])
    label = meta["scalars"]["label"]
    assert label["dtype"] == "|i1"
    np.testing.assert_array_equal(np.fromfile(tmp_path / "mm" / label["path"], label["dtype"]), [1, 0, 1])


@pytest.mark.parametrize("keep, length, most", [("first", 5, 9), ("last", 5, 9), ("top:t", 5, 9),
                                                ("top:t", 64, 80)])  # short values (a gather), long (slices)
def test_the_formats_records_hold_each_event_cut_to_its_row(keep, length, most):
    """The memmap encoder's records (``Format.encoder``, in the workers) read back by the writer's
    ``records.rows_of``: every dtype kind, empty and truncated events, records read at scattered
    ``starts``; each event's row as a per-event reference cuts it from its own columns alone (a
    record depends on its event only, never on the chunk it came in)."""
    from shardsmith.core.events import EventChunk, EventSchema, Field
    from shardsmith.formats.memmap.pad import kept_rows
    from shardsmith.formats.memmap.records import rows_of
    from shardsmith.formats.memmap.shape import layout_of
    from shardsmith.registry import format_named

    rng = np.random.default_rng(3)
    counts = rng.integers(0, most, 300)
    counts[:3] = [0, 2 * length, 6]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    total = int(offsets[-1])
    schema = EventSchema((Field(name="id", dtype="<i8"), Field(name="pos", dtype="<f4", shape=(3,)),
                          Field(name="flag", dtype="|b1"), Field(name="t", dtype="<f8", counter="n"),
                          Field(name="q", dtype="<f2", counter="n"), Field(name="aux", dtype="|b1", counter="n"),
                          Field(name="dom", dtype="<i2", counter="n")))
    chunk = EventChunk(first=0, n=len(counts), offsets={"n": offsets}, columns={
        "id": np.arange(len(counts), dtype="<i8"), "pos": rng.random((len(counts), 3)).astype("<f4"),
        "flag": rng.random(len(counts)) < 0.5, "t": rng.random(total), "q": rng.random(total).astype("<f2"),
        "aux": rng.random(total) < 0.3, "dom": rng.integers(-99, 99, total).astype("<i2")})
    layout = layout_of(schema, max_len=length, dtype="float16", keep=keep)
    job = WriteJob(opts=None, out=Path("unused"), schema=schema,
                   options=OptionValues(values={"max_len": length, "dtype": "float16", "keep": keep}))
    encoded = format_named("memmap").encoder(job, "events").records(chunk, schema)
    assert not encoded.refused
    order = rng.permutation(len(counts))
    payload = encoded.payload(order)
    assert len(payload) == encoded.lengths.sum() and not np.any(encoded.lengths % 8)
    starts = np.concatenate([[0], np.cumsum(encoded.lengths[order])])[:-1][np.argsort(order)]  # record k's place
    pick = np.concatenate([[0, 1, 2], rng.permutation(np.arange(3, len(counts)))[:200]])
    got = rows_of(encoded.lengths[pick], payload, layout, starts=starts[pick])
    np.testing.assert_array_equal(got.counts, counts[pick])
    np.testing.assert_array_equal(got.lengths, np.minimum(counts[pick], length))
    at = np.concatenate([[0], np.cumsum(got.lengths)])
    for k, i in enumerate(pick.tolist()):
        alone = chunk.take(np.array([i]), schema)
        values, _, _ = kept_rows(alone, layout)
        np.testing.assert_array_equal(got.values[at[k]:at[k + 1]], values, err_msg=f"event {i}")
        for f in schema.fixed:
            np.testing.assert_array_equal(got.scalars[f.name][k], chunk.columns[f.name][i], err_msg=f.name)
    assert b"".join(encoded.pieces(order)[0]) == payload.tobytes()  # what the scatter writes piece by piece
    lying = payload.copy()  # event 1's count (after id, pos and flag: 32 bytes) says 3 values, its record holds L
    lying[starts[1] + 32:starts[1] + 40] = np.frombuffer(np.int64(3).tobytes(), np.uint8)
    with pytest.raises(ValueError, match="another size"):  # refused, never a short or foreign row
        rows_of(encoded.lengths[pick], lying, layout, starts=starts[pick])
