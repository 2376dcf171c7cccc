"""``convert --to lance``: JSONL and Parquet rows into a Lance dataset per split that pylance reads
back equal to the inputs by random access (``take``), in the shuffle's order (the keys of the same
seed's ``--to webdataset`` output); the same bytes for any ``--workers``/``--memory`` and run after
run (the table's manifest included: ``formats/lance/table.py``), verified, inspected. (The format
contract, with its crash-resume and own-files checks, runs in tests/test_contracts.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_parquet_format import convert_to, input_rows, same_fields, write_inputs

from shardsmith.testing.runs import digest, manifest, run, run_ok

lance = pytest.importorskip("lance", reason="--to lance needs pylance")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = pytest.mark.filterwarnings("ignore:lance is not fork-safe")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_inputs(tmp_path_factory.mktemp("lance_inputs"))


def convert(src: Path, out: Path, *args: str) -> Path:
    return convert_to("lance", src, out, *args)


@pytest.fixture(scope="module")
def outputs(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lance_outputs")
    return {name: convert(src, root / name) for name, src in inputs.items()}


def table(out: Path, split: str = "train") -> Any:
    return lance.dataset(str(out / f"{split}.lance"))


@pytest.mark.parametrize("name", ["rows", "table"])
def test_take_reads_the_inputs_back_in_the_shuffle_order(name, inputs, outputs, tmp_path):
    """Rows taken by their place, in a scrambled order, are the inputs' values in the order of the
    same seed's webdataset keys."""
    import shardsmith

    ds = table(outputs[name])
    n = ds.count_rows()
    order = [(i * 37) % n for i in range(n)]
    taken = ds.take(order).to_pylist()
    rows = [None] * n
    for i, row in zip(order, taken):
        rows[i] = row
    wds = tmp_path / "wds"
    run_ok(["convert", str(inputs[name]), "-o", str(wds), "--seed", "3", "--to", "webdataset"])
    tar = shardsmith.open(str(wds), split="train")
    assert [r["__key__"] for r in rows] == [tar[i]["__key__"] for i in range(len(tar))]
    want = input_rows(inputs, name)
    assert sorted(r["id"] for r in rows) == sorted(want)
    for row in rows:
        same_fields(row, want[row["id"]])
    assert ds.schema.field("__key__").type == pa.string() and ds.schema.field("id").type == pa.int64()
    if name == "table":
        assert ds.schema.names == ["__key__", "id", "text", "blob", "x", "vec", "maybe"]  # the input's order
        assert ds.schema.field("blob").type == pa.binary() and ds.schema.field("vec").type == pa.list_(pa.int64())


def test_one_fragment_per_shard_in_order(outputs):
    m = manifest(outputs["rows"])
    shards = m["splits"]["train"]["shards"]
    assert [s["samples"] for s in shards] == [25, 25, 25, 5]
    fragments = table(outputs["rows"]).get_fragments()
    assert [f.metadata.files[0].path for f in fragments] == [s["path"].rsplit("/", 1)[-1] for s in shards]
    assert [f.count_rows() for f in fragments] == [25, 25, 25, 5]
    assert m["lance"]["file_version"] == "2.1" and m["splits"]["train"]["lance"]["dataset"] == "train.lance"
    assert table(outputs["rows"]).versions()[0]["timestamp"].timestamp() == 0  # the epoch, not the clock


def test_the_same_bytes_for_any_workers_memory_and_run(inputs, outputs, tmp_path):
    for k, args in enumerate((["--workers", "2"], ["--workers", "1", "--memory", "16MB"])):
        again = convert(inputs["rows"], tmp_path / f"again{k}", *args)
        assert digest(again) == digest(outputs["rows"]), args
    assert any(p.endswith(".manifest") for p in digest(outputs["rows"]))  # the table's files are compared too


def test_verify_passes_and_a_flipped_byte_fails_in_one_line(outputs, tmp_path):
    out = tmp_path / "flipped"
    shutil.copytree(outputs["table"], out)
    assert run(["verify", str(out), "--deep"]).exit_code == 0
    for rel in (manifest(out)["splits"]["train"]["shards"][1]["path"],
                next(f["path"] for f in manifest(out)["splits"]["train"]["lance"]["files"]
                     if f["path"].endswith(".manifest"))):
        data = bytearray((out / rel).read_bytes())
        data[len(data) // 3] ^= 0x10
        (out / rel).write_bytes(bytes(data))
        res = run(["verify", str(out)])
        assert res.exit_code == 1 and f"FAIL {rel}" in res.output and "Traceback" not in res.output + res.stderr
        data[len(data) // 3] ^= 0x10
        (out / rel).write_bytes(bytes(data))


def test_shardsmith_open_reads_the_rows_as_pylance_does(outputs):
    import shardsmith

    ds = shardsmith.open(str(outputs["table"]), split="train")
    rows = table(outputs["table"]).to_table().to_pylist()
    assert len(ds) == len(rows) and [ds[i] for i in (0, 31, len(ds) - 1)] == [rows[0], rows[31], rows[-1]]


def test_inspect_shows_a_row(outputs):
    res = run_ok(["inspect", str(outputs["rows"]), "--samples", "1"])
    assert "lance dataset" in res.output and "key " in res.output and "train.lance" in res.output


def test_shards_of_other_columns_join_and_two_types_stop_the_run_in_one_line(tmp_path):
    src = tmp_path / "sparse.jsonl"
    rows = [{"id": i, **({"late": f"v{i}"} if i >= 10 else {}), "note": None if i < 5 else "n"} for i in range(15)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "sparse"
    run_ok(["convert", str(src), "-o", str(out), "--to", "lance", "--shard-samples", "5", "--no-shuffle"])
    got = table(out).to_table().to_pylist()
    assert [{k: v for k, v in r.items() if k != "__key__"} for r in got] == \
        [{"id": r["id"], "late": r.get("late"), "note": r["note"]} for r in rows]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({"id": i, "v": i if i < 4 else f"s{i}"}) + "\n" for i in range(8)))
    res = run(["convert", str(mixed), "-o", str(tmp_path / "out"), "--to", "lance", "--shard-samples", "4",
               "--no-shuffle"])
    last = res.stderr.strip().splitlines()[-1]
    assert res.exit_code == 1 and last.startswith("shardsmith: error: --to lance: field 'v'"), res.stderr
    assert "Traceback" not in res.stderr


def test_the_manifest_timestamp_is_rewritten_and_nothing_else(tmp_path):
    """``table.fixed_timestamp``: the epoch in place of the clock's time; pylance reads the rest unchanged."""
    from shardsmith.formats.lance.table import fixed_timestamp

    data = pa.table({"a": [1, 2, 3]})
    for name in ("x", "y"):
        lance.write_dataset(data, str(tmp_path / name))
    paths = [next((tmp_path / n / "_versions").glob("*.manifest")) for n in ("x", "y")]
    for p in paths:
        fixed_timestamp(p)
    ds = lance.dataset(str(tmp_path / "x"))
    assert ds.versions()[0]["timestamp"].timestamp() == 0 and ds.to_table().equals(data)
    bad = tmp_path / "bad.manifest"
    bad.write_bytes(b"not a manifest at all")
    from shardsmith.errors import ShardsmithError

    with pytest.raises(ShardsmithError, match="not a Lance manifest"):
        fixed_timestamp(bad)


def test_images_are_their_files_bytes_and_class_in_the_shuffle_order(tmp_path):
    """An image folder: each row the image's bytes as stored, its extension and its class (the
    folder's place among the classes), in the same seed's webdataset order; the same bytes for any --workers."""
    from conftest import jpeg_folder

    import shardsmith

    src = jpeg_folder(tmp_path / "img", classes=3, per_class=6)
    outs = [tmp_path / f"l{w}" for w in (1, 2)]
    for out, w in zip(outs, (1, 2)):
        run_ok(["convert", str(src), "-o", str(out), "--to", "lance", "--seed", "3", "--shard-samples", "7",
                "--workers", str(w), "-q"])
    assert digest(outs[0]) == digest(outs[1])
    rows = table(outs[0]).take(list(range(18))).to_pylist()
    run_ok(["convert", str(src), "-o", str(tmp_path / "wds"), "--to", "webdataset", "--seed", "3", "-q"])
    tar = shardsmith.open(str(tmp_path / "wds"), split="train")
    assert [r["__key__"] for r in rows] == [tar[i]["__key__"] for i in range(len(tar))]
    files = {(c, (src / f"c{c}" / f"{i}.jpg").read_bytes()) for c in range(3) for i in range(6)}
    assert {(r["cls"], r["image"]) for r in rows} == files and {r["ext"] for r in rows} == {"jpg"}
    assert manifest(outs[0])["classes"] == ["c0", "c1", "c2"]


def test_text_lance_would_compress_at_random_gives_the_same_bytes(tmp_path, monkeypatch):
    """Pages of text large enough for Lance's own choice, FSST (its symbol table trained on a random
    sample), are written with the compression named in the field's metadata instead (``schema.pinned``);
    a shard of thousands of rows is one data file."""
    import random

    rng = random.Random(1)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho"]
    src = tmp_path / "text.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": " ".join(rng.choice(words) for _ in range(rng.randint(40, 100))),
                                       "m": {"a": " ".join(rng.choice(words) for _ in range(9))}}) + "\n"
                           for i in range(4500)))
    from shardsmith.formats.lance import writer

    monkeypatch.setattr(writer, "GROUP_ROWS", 500)  # a shard's rows handed to pylance in several batches
    outs = [tmp_path / f"o{w}" for w in (1, 2)]
    for out, w in zip(outs, (1, 2)):
        run_ok(["convert", str(src), "-o", str(out), "--to", "lance", "--seed", "1", "--shard-samples", "4000",
                "--workers", str(w), "-q"])
    assert digest(outs[0]) == digest(outs[1])
    # one data file of 4,000 rows in 8 batches (pylance, given a row limit past int32's, wrote a file a batch)
    assert [len(f.metadata.files) for f in table(outs[0]).get_fragments()] == [1, 1]
    field = table(outs[0]).schema.field("text")
    assert field.metadata[b"lance-encoding:compression"] == b"zstd"


FORKED = """
import multiprocessing, sys
import shardsmith
from shardsmith.errors import DatasetError

ds = shardsmith.open(sys.argv[1])
ds[0]  # pylance used here first


def child(q):
    ds._held = None  # (the shard read whole in the parent is plain Arrow: a new shard's read is pylance's)
    try:
        ds[1]
        q.put("READ")
    except DatasetError as exc:
        q.put(str(exc))


ctx = multiprocessing.get_context("fork")
q = ctx.Queue()
p = ctx.Process(target=child, args=(q,))
p.start()
print(q.get(timeout=120))
p.join()
print("exit", p.exitcode)
"""


def test_a_forked_reader_after_its_parent_read_is_one_line_not_a_crash(outputs):
    """pylance is not fork-safe: a DataLoader worker forked from a process that read the dataset is
    refused in one line naming the shard (run in a subprocess: a crash would take pytest with it)."""
    import subprocess
    import sys

    got = subprocess.run([sys.executable, "-c", FORKED, str(outputs["rows"])], capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    line, code = got.stdout.splitlines()[:2]
    assert "not fork-safe" in line and "spawn" in line and "\n" not in line, line
    assert code == "exit 0", got.stdout
