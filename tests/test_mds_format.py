"""``convert --to mds``: MosaicML Streaming's MDS shards that ``streaming.StreamingDataset`` reads back
(local, its own shuffle off) in shardsmith's shuffled order, with the inputs' values; the same bytes
for any workers and runs; verify, inspect; the format contract (``shardsmith.testing``).

mosaicml-streaming is not in the ``dev`` extra (its release pins numpy, transformers and torchvision
below ours): ``make install-dev`` installs it without its requirements (the Makefile), and the tests
that read back with it skip where it is not installed. Its package
imports ``streaming.vision`` (torchvision) first; where torchvision cannot be imported with our torch,
that subpackage is stood in for (the MDS reader does not use it).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import jpeg_folder, run_cli, tree_digest
from test_contracts import two_jsonl_files

from shardsmith import open as open_dataset
from shardsmith.testing import FormatContract
from shardsmith.testing.runs import run_killed

ROWS = [{"id": i, "text": f"row {i} " + "ab" * (i % 5), "score": i / 4, "ok": i % 3 == 0,
         "tags": ["t"] * (i % 3), "meta": {"n": i, "none": None}} for i in range(40)]


def streaming_module() -> Any:
    """mosaicml-streaming, imported for reading local MDS (skips the test where it is not installed)."""
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("mosaicml-streaming is not installed")
    try:
        return importlib.import_module("streaming")
    except (ImportError, RuntimeError):  # torchvision built against another torch: the vision datasets only
        for name in [m for m in sys.modules if m == "streaming" or m.startswith(("streaming.", "torchvision"))]:
            del sys.modules[name]
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
        return importlib.import_module("streaming")


def read_back(out: Path, **kw: Any) -> list[dict[str, Any]]:
    """Every sample as ``StreamingDataset(local=out, shuffle=False, batch_size=1)`` gives it."""
    streaming = streaming_module()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1, **kw)
    return [ds[i] for i in range(len(ds))]


def tar_keys(out: Path) -> list[str]:
    """The keys of a webdataset output, in order (shardsmith's own reader)."""
    ds = open_dataset(out, split="train")
    return [ds[i]["__key__"] for i in range(len(ds))]


def convert(inputs: Path, out: Path, *args: str) -> None:
    res = run_cli("convert", inputs, "-o", out, "--seed", "7", *args)
    assert res.exit_code == 0, res.output + res.stderr


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": pa.array(range(30), pa.int64()), "name": [f"n{i}" for i in range(30)],
                             "blob": [bytes([i]) * (i + 1) for i in range(30)],
                             "x": pa.array([i * 0.5 for i in range(30)], pa.float64()),
                             "maybe": [None if i % 4 == 0 else i for i in range(30)]}), path, row_group_size=10)
    return path


def test_jsonl_rows_read_back_by_streaming_in_our_order(jsonl: Path, tmp_path: Path) -> None:
    convert(jsonl, tmp_path / "mds", "--to", "mds", "--shard-samples", "16")
    convert(jsonl, tmp_path / "tar", "--to", "webdataset", "--shard-samples", "16")
    got = read_back(tmp_path / "mds")
    assert [s["__key__"] for s in got] == tar_keys(tmp_path / "tar")  # the same seed's order as every format
    by_id = {r["id"]: r for r in ROWS}
    for s in got:
        row = {k: v for k, v in s.items() if k != "__key__"}
        assert row == by_id[row["id"]]
        assert type(row["id"]) is int and type(row["ok"]) is bool and isinstance(row["score"], float)
    assert sorted(s["id"] for s in got) == list(range(len(ROWS)))
    assert (tmp_path / "mds" / "index.json").is_file() and len(list((tmp_path / "mds" / "mds" / "train").glob("*.mds"))) == 3
    assert read_back(tmp_path / "mds" / "mds", split="train") == got  # the split's own index.json


def test_parquet_rows_read_back_with_their_types(parquet: Path, tmp_path: Path) -> None:
    convert(parquet, tmp_path / "mds", "--to", "mds", "--shard-samples", "8")
    convert(parquet, tmp_path / "tar", "--to", "webdataset", "--shard-samples", "8")
    got = read_back(tmp_path / "mds")
    assert [s["__key__"] for s in got] == tar_keys(tmp_path / "tar")
    for s in got:
        i = s["id"]
        assert s["name"] == f"n{i}" and s["blob"] == bytes([i]) * (i + 1) and s["x"] == i * 0.5
        assert s["maybe"] == (None if i % 4 == 0 else i)  # null in some rows: a json column where they mix
    first = json.loads((tmp_path / "mds" / "mds" / "train" / "index.json").read_text())["shards"][0]
    assert dict(zip(first["column_names"], first["column_encodings"], strict=True))["blob"] == "bytes"


def test_rows_of_different_fields_read_back_with_nulls(tmp_path: Path) -> None:
    path = tmp_path / "ragged.jsonl"
    path.write_text('{"a": 1}\n{"a": "x", "b": [1]}\n{"b": 2.5}\n')
    convert(path, tmp_path / "mds", "--to", "mds")
    got = {json.dumps(s["b"]): s["a"] for s in read_back(tmp_path / "mds")}
    assert got == {"null": 1, "[1]": "x", "2.5": None}


def test_the_same_bytes_for_any_workers_and_runs(jsonl: Path, tmp_path: Path) -> None:
    digests = []
    for name, workers in (("a", "1"), ("b", "2"), ("c", "2")):
        convert(jsonl, tmp_path / name, "--to", "mds", "--shard-samples", "7", "--workers", workers)
        digests.append(tree_digest(tmp_path / name))
    assert digests[0] == digests[1] == digests[2] and len(digests[0]) == 8  # 6 shards, 2 indexes


def test_verify_inspect_and_a_flipped_byte(jsonl: Path, tmp_path: Path) -> None:
    out = tmp_path / "mds"
    convert(jsonl, out, "--to", "mds", "--shard-samples", "16")
    assert run_cli("verify", "--deep", out).exit_code == 0
    res = run_cli("inspect", out)
    assert res.exit_code == 0 and "mds dataset" in res.output and "mds columns: __key__ (str)" in res.output and "sample train[0]: key" in res.output
    shard = out / "mds" / "train" / "shard.00001.mds"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01
    shard.write_bytes(bytes(data))
    res = run_cli("verify", out)
    assert res.exit_code == 1 and "FAIL mds/train/shard.00001.mds" in res.output and "Traceback" not in res.output


def test_several_splits_each_in_its_folder(jsonl: Path, tmp_path: Path) -> None:
    out = tmp_path / "mds"
    convert(jsonl, out, "--to", "mds", "--split", "train=0.75,val=0.25")
    assert not (out / "index.json").exists()  # local=OUT alone would read both splits as one
    train, val = read_back(out / "mds", split="train"), read_back(out / "mds", split="val")
    assert len(train) + len(val) == len(ROWS) and not {s["id"] for s in train} & {s["id"] for s in val}
    ds = open_dataset(out, split="val")
    assert [ds[i]["__key__"] for i in range(len(ds))] == [s["__key__"] for s in val]


def test_overwrite_never_touches_a_users_folder(jsonl: Path, tmp_path: Path) -> None:
    out = tmp_path / "mds"
    convert(jsonl, out, "--to", "mds", "--split", "train=0.75,val=0.25")
    (out / "train").mkdir()
    (out / "train" / "index.json").write_text("{}")  # a user's file of an MDS name, in a folder of a split's name
    res = run_cli("convert", jsonl, "-o", out, "--seed", "7", "--to", "mds", "--overwrite")
    assert res.exit_code == 2 and "also found ['train']" in res.stderr, res.stderr
    assert (out / "train" / "index.json").read_text() == "{}"


def test_images_read_back_as_pil_images_and_classes(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    folder = jpeg_folder(tmp_path / "imgs", classes=2, per_class=3)
    convert(folder, tmp_path / "mds", "--to", "mds")
    got = read_back(tmp_path / "mds")
    files = {p.read_bytes(): p.parent.name for p in folder.rglob("*.jpg")}
    assert len(got) == 6
    for s in got:
        assert s["image"].format == "JPEG" and s["ext"] == "jpg"
    ours = open_dataset(tmp_path / "mds", split="train")
    for i in range(len(ours)):
        assert files[ours[i]["image"]] == f"c{ours[i]['cls']}"


def test_a_shard_size_mds_cannot_hold_is_refused(jsonl: Path, tmp_path: Path) -> None:
    res = run_cli("convert", jsonl, "-o", tmp_path / "o", "--to", "mds", "--shard-bytes", "3GiB")
    assert res.exit_code != 0 and "2GiB" in res.output + res.stderr


class TestMdsFormat(FormatContract):
    format = "mds"
    convert_args = ["--text-field", "text", "--shard-samples", "20"]

    def make_inputs(self, folder: Path) -> None:
        two_jsonl_files(folder)



def test_ranks_of_cluster_stages_make_the_same_bytes(jsonl: Path, tmp_path: Path) -> None:
    """Two gather ranks each write a range of a split's shards; the split's index is over both."""
    args = ["convert", jsonl, "--to", "mds", "--shard-samples", "6", "--split", "train=0.8,val=0.2", "-q"]
    assert run_cli(*args, "-o", tmp_path / "one").exit_code == 0
    for stage, rank in (("scatter", 0), ("scatter", 1), ("plan", 0), ("gather", 1), ("gather", 0), ("finalize", 0)):
        res = run_cli(*args, "-o", tmp_path / "two", "--stage", stage, "--rank", str(rank), "--world-size", "2")
        assert res.exit_code == 0, (stage, rank, res.stderr)
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")


@pytest.mark.parametrize("point", ["gather:train:0", "manifest"])
def test_a_killed_run_resumes_to_the_same_bytes(jsonl: Path, tmp_path: Path, point: str) -> None:
    args = ["convert", jsonl, "--to", "mds", "--shard-samples", "8", "-q"]
    assert run_cli(*args, "-o", tmp_path / "ref").exit_code == 0
    # (with gather workers, the crash point would kill one of them; before the manifest: the parent)
    run_killed([*args, "-o", tmp_path / "out", "--workers", "1" if point.startswith("gather") else "2"], point)
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert run_cli(*args, "-o", tmp_path / "out").exit_code == 0
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "ref")


def test_every_encoding_reads_back_with_streaming(tmp_path: Path) -> None:
    """Values no JSONL or Parquet source gives (arrays, numpy scalars, ints past int64) through
    the encoder and the writer, read back by ``StreamingDataset``."""
    import numpy as np

    from shardsmith.formats.mds.encoding import MdsEncoder
    from shardsmith.formats.mds.writer import MdsWriter
    from shardsmith.kit.sample import Sample

    rows = [{"a": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int16(-3), "f": np.float32(0.5),
             "big": 1 << 70, "b": b"\x00\xff", "t": True, "none": None, "d": {"x": [1, None]}}] * 3
    payloads = [b"".join(MdsEncoder().encode(Sample(key=f"k{i}", fields=r))) for i, r in enumerate(rows)]
    writer = MdsWriter(out_dir=tmp_path, split="train", shard_samples=2, shard_bytes=1 << 20)
    writer.write_batch(np.array([len(p) for p in payloads]), memoryview(b"".join(payloads)))
    pieces = [{"shards": [s.to_json() for s in writer.close()]}]
    writer.finish_split(pieces)
    got = read_back(tmp_path / "mds", split="train")
    assert [s["__key__"] for s in got] == ["k0", "k1", "k2"]
    for s in got:
        assert s["a"].dtype == np.float32 and np.array_equal(s["a"], rows[0]["a"])
        assert s["n"] == -3 and s["f"] == 0.5 and s["big"] == 1 << 70 and s["b"] == b"\x00\xff"
        assert s["t"] is True and s["none"] is None and s["d"] == {"x": [1, None]}
