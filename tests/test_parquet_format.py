"""``convert --to parquet``: JSONL and Parquet rows into Parquet shards that pyarrow and HuggingFace
``datasets`` read back equal to the inputs, in the shuffle's order (the keys of the same seed's
``--to webdataset`` output), the same bytes for any ``--workers``/``--memory`` and run after run,
verified, inspected, with a card whose features ``datasets`` takes. (The format contract, with its
crash-resume and own-files checks, runs in tests/test_contracts.py.)"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from shardsmith.testing.runs import digest, manifest, run, run_ok

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SMALL = ["--shard-samples", "25"]  # (and for parquet, row groups of 10: ``convert``)


def jsonl_rows(n: int = 80) -> list[dict[str, Any]]:
    """Rows of every JSON kind: ints, floats, text, lists, objects, a field some rows lack, nulls."""
    rng = random.Random(7)
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"id": i, "text": f"doc {i}: " + "word " * rng.randint(0, 9),
                               "score": rng.random() * 10 - 5, "tags": ["t"] * (i % 3), "flag": i % 2 == 0}
        if i % 4 == 0:
            row["note"] = None if i % 8 else f"note {i}"
        if i % 5 == 0:
            row["meta"] = {"a": i, "b": [0.5, i / 3]}
        rows.append(row)
    return rows


def parquet_table(n: int = 60) -> Any:
    ids = list(range(n))
    return pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array([f"row {i}" for i in ids], pa.string()),
                     "blob": pa.array([bytes([i % 256]) * (i % 5 + 1) for i in ids], pa.binary()),
                     "x": pa.array([i / 7 for i in ids], pa.float64()),
                     "vec": pa.array([[i, i + 1] for i in ids], pa.list_(pa.int64())),
                     "maybe": pa.array([None if i % 3 else f"m{i}" for i in ids], pa.string())})


def write_inputs(root: Path) -> dict[str, Path]:
    """Two JSONL files and two Parquet files of the rows above (what the columns formats' tests convert)."""
    (root / "rows").mkdir()
    rows = jsonl_rows()
    for name, part in (("a.jsonl", rows[:50]), ("b.jsonl", rows[50:])):
        (root / "rows" / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    (root / "table").mkdir()
    table = parquet_table()
    pq.write_table(table.slice(0, 35), root / "table" / "a.parquet", row_group_size=10)
    pq.write_table(table.slice(35), root / "table" / "b.parquet", row_group_size=10)
    return {"rows": root / "rows", "table": root / "table"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_inputs(tmp_path_factory.mktemp("parquet_inputs"))


def convert_to(to: str, src: Path, out: Path, *args: str) -> Path:
    run_ok(["convert", str(src), "-o", str(out), "--seed", "3", "--memory", "64MB", *SMALL, "--to", to, *args])
    return out


def convert(src: Path, out: Path, *args: str) -> Path:
    return convert_to("parquet", src, out, "--row-group-rows", "10", *args)


@pytest.fixture(scope="module")
def outputs(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parquet_outputs")
    return {name: convert(src, root / name) for name, src in inputs.items()}


def shard_rows(out: Path) -> list[dict[str, Any]]:
    """Every row of the dataset, shard by shard, as pyarrow reads each file."""
    m = manifest(out)
    return [row for shard in m["splits"]["train"]["shards"] for row in pq.read_table(out / shard["path"]).to_pylist()]


def input_rows(inputs: dict[str, Path], name: str) -> dict[int, dict[str, Any]]:
    if name == "rows":
        return {r["id"]: r for r in jsonl_rows()}
    return {r["id"]: r for r in parquet_table().to_pylist()}


def same_fields(got: dict[str, Any], want: dict[str, Any]) -> None:
    """A row read back against its input: every input field equal, the others (fields other rows have) null."""
    rest = {k: v for k, v in got.items() if k != "__key__"}
    for k, v in rest.items():
        expected = want.get(k)
        if isinstance(expected, dict) and isinstance(v, dict):  # a struct holds every key any row had
            assert {a: b for a, b in v.items() if a in expected} == expected and \
                all(b is None for a, b in v.items() if a not in expected), (k, v, expected)
        else:
            assert v == expected, (k, v, expected)
    assert set(want) <= set(rest)


@pytest.mark.parametrize("name", ["rows", "table"])
def test_pyarrow_reads_the_inputs_back_in_the_shuffle_order(name, inputs, outputs, tmp_path):
    """The rows, read with pyarrow, are the inputs' values, in the order of the same seed's webdataset keys."""
    import shardsmith

    rows = shard_rows(outputs[name])
    wds = tmp_path / "wds"
    run_ok(["convert", str(inputs[name]), "-o", str(wds), "--seed", "3", "--to", "webdataset"])
    tar = shardsmith.open(str(wds), split="train")
    assert [r["__key__"] for r in rows] == [tar[i]["__key__"] for i in range(len(tar))]
    want = input_rows(inputs, name)
    assert sorted(r["id"] for r in rows) == sorted(want)
    for row in rows:
        same_fields(row, want[row["id"]])
    types = pq.read_schema(outputs[name] / manifest(outputs[name])["splits"]["train"]["shards"][0]["path"])
    assert types.field("__key__").type == pa.string() and types.field("id").type == pa.int64()
    if name == "table":
        assert types.names == ["__key__", "id", "text", "blob", "x", "vec", "maybe"]  # the input's order
        assert types.field("blob").type == pa.binary() and types.field("vec").type == pa.list_(pa.int64())


@pytest.mark.parametrize("name", ["rows", "table"])
def test_polars_and_duckdb_read_the_folder_back_equal_to_the_inputs(name, inputs, outputs):
    """A glob over the shards, as the readers take it (one schema in every file: no option to unify),
    in the shards' order: each row equal to its input (lists, structs, bytes, nulls)."""
    polars = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")

    want = input_rows(inputs, name)
    by_polars = polars.read_parquet(str(outputs[name] / "train-*.parquet")).to_dicts()
    table = duckdb.sql(f"select * from read_parquet('{outputs[name]}/*.parquet')").arrow()  # (in no one order)
    by_duckdb = table.read_all().to_pylist() if hasattr(table, "read_all") else table.to_pylist()
    rows = shard_rows(outputs[name])
    assert [r["__key__"] for r in by_polars] == [r["__key__"] for r in rows]
    for got in (by_polars, by_duckdb):
        assert sorted(r["id"] for r in got) == sorted(want)
        for row in got:
            same_fields(row, want[row["id"]])


def test_row_groups_and_shards_are_cut_by_the_options(outputs):
    m = manifest(outputs["rows"])
    shards = m["splits"]["train"]["shards"]
    assert [s["samples"] for s in shards] == [25, 25, 25, 5]
    meta = pq.ParquetFile(outputs["rows"] / shards[0]["path"]).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [10, 10, 5]
    column = meta.row_group(0).column(1)
    assert column.compression == "ZSTD" and column.statistics is not None and column.statistics.has_min_max
    assert m["parquet"]["compression"] == "zstd" and m["format_options"]["row_group_rows"] == 10


@pytest.mark.parametrize("name", ["rows", "table"])
def test_load_dataset_reads_the_folder(name, inputs, outputs, tmp_path):
    datasets = pytest.importorskip("datasets", reason="the dataset card is tested with HuggingFace datasets")
    ds = datasets.load_dataset(str(outputs[name]), cache_dir=str(tmp_path / "hf"))
    rows = shard_rows(outputs[name])
    assert list(ds) == ["train"] and len(ds["train"]) == len(rows)
    # every shard carries the split's one schema (formats/parquet/joined.py), the card's features
    columns = list(ds["train"].features)
    assert ds["train"].to_list() == [{c: row.get(c) for c in columns} for row in rows]


def test_the_same_bytes_for_any_workers_memory_and_run(inputs, outputs, tmp_path):
    for k, args in enumerate((["--workers", "2"], ["--workers", "1", "--memory", "16MB"], [])):
        again = convert(inputs["rows"], tmp_path / f"again{k}", *args)
        assert digest(again) == digest(outputs["rows"]), args


def test_verify_passes_and_a_flipped_byte_fails_in_one_line(outputs, tmp_path):
    import shutil

    out = tmp_path / "flipped"
    shutil.copytree(outputs["table"], out)
    assert run(["verify", str(out), "--deep"]).exit_code == 0
    rel = manifest(out)["splits"]["train"]["shards"][1]["path"]
    data = bytearray((out / rel).read_bytes())
    data[len(data) // 3] ^= 0x10
    (out / rel).write_bytes(bytes(data))
    res = run(["verify", str(out)])
    assert res.exit_code == 1 and f"FAIL {rel}" in res.output and "Traceback" not in res.output + res.stderr


def test_shardsmith_open_reads_the_rows_as_pyarrow_does(outputs):
    import shardsmith

    ds = shardsmith.open(str(outputs["table"]), split="train")
    rows = shard_rows(outputs["table"])
    assert len(ds) == len(rows) and [ds[i] for i in (0, 31, len(ds) - 1)] == [rows[0], rows[31], rows[-1]]


def test_inspect_shows_a_row(outputs):
    res = run_ok(["inspect", str(outputs["rows"]), "--samples", "1"])
    assert "parquet dataset" in res.output and "key " in res.output and "zstd" in res.output


def test_a_field_of_two_types_stops_the_run_in_one_line(tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_text("".join(json.dumps({"id": i, "v": i if i % 2 else f"s{i}"}) + "\n" for i in range(6)))
    res = run(["convert", str(src), "-o", str(tmp_path / "out"), "--to", "parquet"])
    last = res.stderr.strip().splitlines()[-1]
    assert res.exit_code == 1 and last.startswith("shardsmith: error: --to parquet: field 'v'"), res.stderr
    assert "Traceback" not in res.stderr


def test_the_card_features_are_those_datasets_derives_from_the_schema():
    datasets = pytest.importorskip("datasets")
    from shardsmith.formats.parquet.card import schema_features

    schema = pa.schema([("__key__", pa.string()), ("a", pa.int32()), ("b", pa.float32()), ("c", pa.list_(pa.int64())),
                        ("d", pa.struct([("x", pa.string()), ("y", pa.list_(pa.struct([("z", pa.bool_())])))])),
                        ("e", pa.binary()), ("n", pa.null()), ("ll", pa.list_(pa.list_(pa.float64())))])
    assert schema_features(schema) == datasets.Features.from_arrow_schema(schema)._to_yaml_list()


def test_the_encoding_reads_back_typed_and_in_order_many_at_once():
    """``rows.py``: bytes, arrays and JSON values, in each sample's order, a group's heads parsed at once."""
    import numpy as np

    from shardsmith.formats.arrow_rows.rows import RowEncoder, decode_rows
    from shardsmith.kit.sample import FileBytes, RecordError, Sample

    enc = RowEncoder()
    grid = np.arange(6, dtype=np.int16).reshape(2, 3)
    samples = [Sample(key="a", fields={"x": 1, "blob": b"\x00\xff", "grid": grid, "s": "t"}),
               Sample(key="b", fields={"s": None, "x": 2.5}), Sample(key="c", fields={"img": FileBytes(data=b"jp", file=0)})]
    keys, rows = decode_rows([b"".join(enc.encode(s)) for s in samples])
    assert keys == ["a", "b", "c"]
    assert list(rows[0]) == ["x", "blob", "grid", "s"] and rows[0]["blob"] == b"\x00\xff"
    assert rows[0]["grid"].dtype == np.int16 and rows[0]["grid"].tolist() == grid.tolist()
    assert rows[1] == {"s": None, "x": 2.5} and rows[2] == {"img": b"jp"}
    with pytest.raises(RecordError, match="__key__"):
        enc.encode(Sample(key="d", fields={"__key__": 1}))
