"""``convert --to parquet``: every shard of a dataset carries one Arrow schema (``formats/parquet/joined.py``),
though each typed its columns from its own rows: a field null in all of one shard's rows, ints in one
shard and floats in another, a field one shard's rows lack. A reader of the whole folder (pyarrow's
datasets, Polars, DuckDB) reads it as one table with no option to unify them, the values equal to the
inputs; the same bytes for any ``--workers``/``--memory``, from cluster stages and after a kill while
shards are rewritten; two types no column holds stop the run in one line naming both shards; a
Parquet input's columns keep their types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardsmith.testing.runs import digest, manifest, run, run_killed, run_ok

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ARGS = ["--to", "parquet", "--shard-samples", "4", "--row-group-rows", "3", "--no-shuffle"]
ONE = pa.schema([("__key__", pa.string()), ("id", pa.int64()), ("v", pa.float64()), ("n", pa.string()),
                 ("late", pa.struct([("a", pa.int64())]))])


def rows() -> list[dict[str, Any]]:
    """Shards of 4 rows, in order: ``n`` null in all of the first's, ``v`` ints in the first and
    third and floats in the second, ``late`` only in the third's rows."""
    out: list[dict[str, Any]] = []
    for i in range(12):
        row: dict[str, Any] = {"id": i, "v": i + 0.5 if 4 <= i < 8 else i, "n": None if i < 4 else f"t{i}"}
        if i >= 8:
            row["late"] = {"a": i}
        out.append(row)
    return out


def expected() -> list[dict[str, Any]]:
    return [{"id": r["id"], "v": float(r["v"]), "n": r["n"], "late": r.get("late")} for r in rows()]


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pqschema") / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    return path


@pytest.fixture(scope="module")
def out(src: Path) -> Path:
    folder = src.parent / "out"
    run_ok(["convert", str(src), "-o", str(folder), *ARGS])
    return folder


def files(out: Path) -> list[str]:
    return [str(out / s["path"]) for s in manifest(out)["splits"]["train"]["shards"]]


def without_key(table_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "__key__"} for r in table_rows]


def test_every_shard_carries_the_one_schema_and_pyarrow_reads_the_folder_as_one_table(out):
    import pyarrow.dataset as ds

    assert len(files(out)) == 3
    for path in files(out):
        assert pq.read_schema(path).remove_metadata().equals(ONE), path
    whole = ds.dataset(files(out), format="parquet").to_table()
    assert without_key(whole.to_pylist()) == expected()
    # the folder itself: README.md and manifest.json are no Parquet files
    folder = ds.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table()
    assert folder.schema.remove_metadata().equals(ONE) and folder.num_rows == 12
    assert run(["verify", str(out), "--deep"]).exit_code == 0


def test_polars_and_duckdb_read_the_glob_back_equal_to_the_inputs(out):
    polars = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")

    got = polars.read_parquet(str(out / "train-*.parquet")).sort("id").drop("__key__").to_dicts()
    assert got == expected()
    table = duckdb.sql(f"select id, v, n, late from read_parquet('{out}/*.parquet') order by id").arrow()
    if not isinstance(table, pa.Table):  # (a record batch reader in some releases)
        table = table.read_all()
    assert table.to_pylist() == expected()


def test_load_dataset_reads_the_one_schema(out, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))
    assert without_key(ds["train"].to_list()) == expected()
    assert ds["train"].features.arrow_schema.remove_metadata().equals(ONE)


def test_the_same_bytes_for_any_workers_and_memory_and_after_a_kill_while_rewriting(src, out, tmp_path):
    again = tmp_path / "again"
    run_ok(["convert", str(src), "-o", str(again), *ARGS, "--workers", "2", "--memory", "16MB"])
    assert digest(again) == digest(out)
    killed = tmp_path / "killed"
    cmd = ["convert", str(src), "-o", str(killed), *ARGS]
    run_killed(cmd, "rejoin:train:1")  # the first shard rewritten, the second's piece names its new file
    run_ok(cmd)
    assert digest(killed) == digest(out)
    assert run(["verify", str(killed)]).exit_code == 0


def test_the_same_bytes_from_cluster_stages(src, out, tmp_path):
    """Each gather rank writes its shards typed from their own rows; finalize gives them the one schema."""
    staged = tmp_path / "staged"
    cmd = ["convert", str(src), "-o", str(staged), *ARGS]
    for rank in (0, 1):
        run_ok([*cmd, "--stage", "scatter", "--rank", str(rank), "--world-size", "2"])
    run_ok([*cmd, "--stage", "plan", "--world-size", "3"])
    for rank in (0, 1, 2):
        run_ok([*cmd, "--stage", "gather", "--rank", str(rank), "--world-size", "3"])
    run_ok([*cmd, "--stage", "finalize"])
    assert digest(staged) == digest(out)


def test_a_split_keeps_its_own_columns_with_the_dataset_types():
    from shardsmith.formats.parquet.joined import dataset_schema, split_schema

    train = [pa.schema([("__key__", pa.string()), ("x", pa.int64()), ("label", pa.int64())])]
    test = [pa.schema([("__key__", pa.string()), ("x", pa.float64())]),
            pa.schema([("__key__", pa.string()), ("x", pa.null())])]
    whole = dataset_schema({"train": train, "test": test}, {"train": ["a"], "test": ["b", "c"]})
    assert whole.names == ["__key__", "x", "label"] and whole.field("x").type == pa.float64()
    assert split_schema(whole, test) == pa.schema([("__key__", pa.string()), ("x", pa.float64())])
    assert split_schema(whole, train) == whole


def test_shards_not_here_are_left_when_their_schemas_agree_and_refused_when_they_differ(tmp_path):
    """Stand-ins whose bytes nothing brings (``kit/shard_bytes.py``: a cluster finalize into object
    storage brings them): the records' schema digests say whether the shards agree; differing ones
    stop it in one line."""
    from shardsmith.errors import ShardsmithError
    from shardsmith.formats.parquet.joined import join_shards
    from shardsmith.formats.parquet.writer import schema_digest
    from shardsmith.kit.writer import ShardRecord

    ints, floats = (pa.schema([("__key__", pa.string()), ("x", t)]) for t in (pa.int64(), pa.float64()))

    def records(*schemas):
        return [ShardRecord(path=f"train-{k:06d}.parquet", samples=1, bytes=10, sha256="0",
                            extra={"schema": schema_digest(s)}) for k, s in enumerate(schemas)]

    def never(*args):
        raise AssertionError("nothing can be rewritten here")

    for k in range(2):  # stand-ins: files of the shards' sizes that are no Parquet
        (tmp_path / f"train-{k:06d}.parquet").write_bytes(bytes(10))
    join_shards(tmp_path, {"train": records(ints, ints)}, replaced=never, rewrite=never)  # agree: left
    with pytest.raises(ShardsmithError, match="column types differ") as err:
        join_shards(tmp_path, {"train": records(ints, floats)}, replaced=never, rewrite=never)
    assert "\n" not in str(err.value)
    assert schema_digest(ints.with_metadata({b"k": b"v"})) == schema_digest(ints) != schema_digest(floats)


def test_ints_in_one_shard_and_text_in_another_stop_the_run_in_one_line(tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_text("".join(json.dumps({"id": i, "v": i if i < 4 else f"s{i}"}) + "\n" for i in range(8)))
    res = run(["convert", str(src), "-o", str(tmp_path / "out"), *ARGS])
    last = res.stderr.strip().splitlines()[-1]
    assert res.exit_code == 1 and "Traceback" not in res.stderr, res.stderr
    assert last.startswith("shardsmith: error: --to parquet: field 'v' is int64 in the rows of shard "
                           "train-000000.parquet and string in those of shard train-000001.parquet"), last


def typed_table(n: int = 30) -> Any:
    """Columns a Parquet input stores in types JSON does not hold (their values reach the writers as
    ints, floats and text): narrow ints and floats, timestamps (naive and zoned), dates, decimals,
    lists of them, structs null in some rows."""
    import datetime
    import decimal

    ids = range(n)
    moment = datetime.datetime(2021, 1, 1, 8, 30)
    return pa.table({
        "i32": pa.array(ids, pa.int32()), "f32": pa.array([i / 4 for i in ids], pa.float32()),
        "ts": pa.array([datetime.datetime(2020, 1, 1, 12, 0, i, 250) if i % 3 else None for i in ids], pa.timestamp("us")),
        "tsz": pa.array([datetime.datetime(2020, 1, 2, i % 24, tzinfo=datetime.timezone.utc) for i in ids],
                        pa.timestamp("ms", tz="UTC")),
        "d": pa.array([datetime.date(2020, 1, 1 + i % 28) for i in ids], pa.date32()),
        "dec": pa.array([decimal.Decimal(i) / 100 for i in ids], pa.decimal128(7, 2)),
        "l": pa.array([[i] * (i % 3) for i in ids], pa.list_(pa.int16())),
        "s": pa.array([{"t": moment, "u": i} if i % 4 else None for i in ids],
                      pa.struct([("t", pa.timestamp("ms")), ("u", pa.uint8())])),
        "txt": pa.array([f"r{i}" for i in ids]), "b": pa.array([bytes([i]) for i in ids])})


def test_a_parquet_input_keeps_its_column_types(tmp_path):
    """``source_types.py``: the values come back in the input's own types, every shard the same schema."""
    import pyarrow.dataset as ds

    src = tmp_path / "typed.parquet"
    table = typed_table()
    pq.write_table(table, src, row_group_size=10)
    out = tmp_path / "out"
    run_ok(["convert", str(src), "-o", str(out), "--to", "parquet", "--shard-samples", "12", "--seed", "1"])
    got = ds.dataset(files(out), format="parquet").to_table()
    assert got.schema.remove_metadata().remove(0).equals(pq.read_schema(src).remove_metadata())
    assert sorted(got.drop(["__key__"]).to_pylist(), key=lambda r: r["i32"]) == table.to_pylist()
    # a --transform may change a field's values: the columns are typed from them then
    again = tmp_path / "again"
    run_ok(["convert", str(src), "-o", str(again), "--to", "parquet", "--transform", "select=i32,ts"])
    assert pq.read_schema(files(again)[0]).field("i32").type == pa.int64()
