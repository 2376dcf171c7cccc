"""convert --to webdataset end to end: what webdataset, wids and GNU tar read back; determinism; bad input."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from conftest import jpeg, run_cli, tree_digest, write_jsonl
from PIL import Image


@pytest.fixture
def image_folder(tmp_path: Path) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    """Three classes of small JPEGs (plus a PNG and a hidden file); rel path → (bytes, label)."""
    root = tmp_path / "imgs"
    expected = {}
    for label, cls in enumerate(["ant", "bee", "cat"]):
        (root / cls).mkdir(parents=True)
        for i in range(12):
            data = jpeg(label * 100 + i)
            name = f"{cls}_{i:02d}.JPG" if i % 5 == 0 else f"{cls}_{i:02d}.jpg"
            (root / cls / name).write_bytes(data)
            expected[f"{cls}/{name}"] = (data, label)
    buf = io.BytesIO()
    Image.new("RGB", (7, 5), "red").save(buf, format="PNG")
    (root / "bee" / "z.png").write_bytes(buf.getvalue())
    expected["bee/z.png"] = (buf.getvalue(), 1)
    (root / "cat" / ".hidden.jpg").write_bytes(b"not an image")
    return root, expected


def convert(*args: str | Path) -> dict:
    res = run_cli("convert", *args, "--to", "webdataset", "--quiet")
    assert res.exit_code == 0, res.stderr
    out = Path(args[args.index("-o") + 1])
    return json.loads((out / "manifest.json").read_text())


def read_webdataset(out: Path, split: str = "train") -> list[dict]:
    import webdataset as wds

    urls = sorted(str(p) for p in out.glob(f"{split}-*.tar"))
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))


def test_webdataset_reads_every_image_with_exact_bytes_and_labels(image_folder, tmp_path):
    root, expected = image_folder
    m = convert(root, "-o", tmp_path / "out", "--shard-samples", "10")
    assert m["classes"] == ["ant", "bee", "cat"]
    assert m["splits"]["train"]["samples"] == len(expected) and len(m["splits"]["train"]["shards"]) == 4
    samples = read_webdataset(tmp_path / "out")
    got = sorted((s.get("jpg", s.get("png")), int(s["cls"])) for s in samples)
    assert got == sorted(expected.values())
    assert len({s["__key__"] for s in samples}) == len(samples)
    assert all("." not in s["__key__"] for s in samples)


def test_wids_and_gnu_tar_read_the_shards(image_folder, tmp_path):
    import wids

    root, expected = image_folder
    convert(root, "-o", tmp_path / "out", "--shard-samples", "8")
    ds = wids.ShardListDataset(str(tmp_path / "out" / "__index__" / "train.wids.json"), transformations=[],
                               cache_dir=str(tmp_path / "wids-cache"))
    assert len(ds) == len(expected)
    blobs = sorted(ds[i].get(".jpg", ds[i].get(".png")).read() for i in range(len(ds)))
    assert blobs == sorted(b for b, _ in expected.values())
    listing = subprocess.run(["tar", "tvf", tmp_path / "out" / "train-000000.tar"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert all(" 0/0 " in line and "1970-01-01 00:00" in line for line in listing)
    extract = tmp_path / "x"
    extract.mkdir()
    subprocess.run(["tar", "xf", tmp_path / "out" / "train-000000.tar", "-C", extract], check=True)
    assert len(list(extract.iterdir())) == 16


def test_shuffle_is_exact_and_workers_do_not_change_bytes(image_folder, tmp_path):
    root, _ = image_folder
    convert(root, "-o", tmp_path / "w1", "--workers", "1", "--shard-bytes", "20KB")
    convert(root, "-o", tmp_path / "w2", "--workers", "2", "--shard-bytes", "20KB", "--memory", "64KB")
    assert tree_digest(tmp_path / "w1") == tree_digest(tmp_path / "w2")
    assert len(list((tmp_path / "w1").glob("train-*.tar"))) > 2
    for tar in (tmp_path / "w1").glob("train-*.tar"):
        assert tar.stat().st_size <= 20_000 and tar.stat().st_size % 10240 == 0
    convert(root, "-o", tmp_path / "ordered", "--no-shuffle")
    keys = [s["__key__"] for s in read_webdataset(tmp_path / "ordered")]
    assert keys == sorted(keys, key=lambda k: k)  # class folders then file names: input order


def test_splits_keep_every_copy_together_and_augment_is_deterministic(image_folder, tmp_path):
    root, expected = image_folder
    args = ["--augment", "random-resized-crop=24,hflip", "--copies", "3", "--split", "train=0.7,val=0.3"]
    m = convert(root, "-o", tmp_path / "a", "--workers", "1", *args)
    convert(root, "-o", tmp_path / "b", "--workers", "2", *args)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    total = m["splits"]["train"]["samples"] + m["splits"]["val"]["samples"]
    assert total == 3 * len(expected) and m["augment"]["copies"] == 3
    for split in ("train", "val"):
        samples = read_webdataset(tmp_path / "a", split)
        stems = {}
        for s in samples:
            assert Image.open(io.BytesIO(s["jpg"])).size == (24, 24)
            stems.setdefault(s["__key__"].split("-c")[0], set()).add(s["__key__"])
        assert all(len(v) == 3 for v in stems.values())  # all three copies in the same split


def test_jsonl_records_become_json_and_txt_members(tmp_path):
    docs = [{"text": f"doc {i}", "n": i, "tags": ["a", "b"]} for i in range(40)]
    write_jsonl(tmp_path / "in" / "a.jsonl", [d["text"] for d in docs])
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    m = convert(tmp_path / "in", "-o", tmp_path / "out", "--text-field", "text", "--no-shuffle")
    assert m["source"]["reader"] == "jsonl"
    samples = read_webdataset(tmp_path / "out")
    assert [json.loads(s["json"]) for s in samples] == docs
    assert [s["txt"].decode() for s in samples] == [d["text"] for d in docs]


def test_parquet_binary_columns_are_members(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    imgs = [jpeg(i) for i in range(9)]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"jpg": imgs, "label": list(range(9)), "caption": [f"c{i}" for i in range(9)]}),
                   tmp_path / "in" / "t.parquet", row_group_size=4)
    convert(tmp_path / "in", "-o", tmp_path / "out", "--no-shuffle")
    samples = read_webdataset(tmp_path / "out")
    assert [s["jpg"] for s in samples] == imgs
    assert [json.loads(s["json"]) for s in samples] == [{"label": i, "caption": f"c{i}"} for i in range(9)]


@pytest.mark.parametrize("bad, reason", [
    (b"", "empty"),
    (b"hello, I am text", "not an image"),
    ("truncated", "truncated JPEG"),
])
def test_bad_images_fail_or_are_skipped_and_listed(image_folder, tmp_path, bad, reason):
    root, expected = image_folder
    data = jpeg(7)[:300] if bad == "truncated" else bad
    (root / "bee" / "broken.jpg").write_bytes(data)
    res = run_cli("convert", root, "-o", tmp_path / "out", "--to", "webdataset", "-q")
    assert res.exit_code == 1 and "bee/broken.jpg" in res.stderr and reason in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out" / "manifest.json").exists()
    assert not list((tmp_path / "out").glob("*.tar")), "a failed run leaves no shard behind"
    m = convert(root, "-o", tmp_path / "skip", "--on-error", "skip")
    (entry,) = m["source"]["skipped"]["records"]
    assert entry["file"] == "bee/broken.jpg" and reason in entry["reason"]
    assert m["source"]["records"] == len(expected) + 1 == m["splits"]["train"]["samples"] + 1


@pytest.mark.parametrize("options", [
    (),
    ("--no-shuffle",),
    ("--split", "train=0.6,val=0.4", "--shard-samples", "5", "--seed", "3"),
    ("--shard-bytes", "60KB", "--workers", "1"),
])
def test_images_planned_from_the_listing_match_the_shuffle_path(image_folder, tmp_path, options):
    """Unchanged images skip the scatter pass (shards planned from the listing, written by workers);
    ``--on-error skip`` takes the general keyed-shuffle path. Both must give the same bytes."""
    root, _ = image_folder
    direct = convert(root, "-o", tmp_path / "direct", *options)
    general = convert(root, "-o", tmp_path / "general", "--on-error", "skip", *options)
    assert direct["splits"] == general["splits"]
    assert tree_digest(tmp_path / "direct") == tree_digest(tmp_path / "general")
    assert sum(len(s["shards"]) for s in direct["splits"].values()) > (1 if "--shard-samples" in options else 0)


def test_folder_problems_are_usage_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    res = run_cli("convert", tmp_path / "empty", "-o", tmp_path / "o", "--to", "webdataset")
    assert res.exit_code == 2 and "no input files" in res.stderr
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "a.jpg").write_bytes(jpeg(1))
    res = run_cli("convert", tmp_path / "loose", "-o", tmp_path / "o2", "--to", "webdataset")
    assert res.exit_code == 2 and "class subfolders" in res.stderr
    res = run_cli("convert", tmp_path / "loose", "-o", tmp_path / "o3", "--to", "webdataset", "--copies", "2")
    assert res.exit_code == 2 and "--copies needs --augment" in res.stderr


def test_loader_inspect_and_bench_on_converted_images(image_folder, tmp_path):
    import shardsmith

    root, expected = image_folder
    convert(root, "-o", tmp_path / "out", "--shard-samples", "7")
    ds = shardsmith.open(tmp_path / "out")
    by_key = {s["__key__"]: s for s in read_webdataset(tmp_path / "out")}
    assert len(ds) == len(by_key) == len(expected)
    for i in range(len(ds)):
        s = ds[i]
        ref = by_key[s["__key__"]]
        assert s.get("jpg", s.get("png")) == ref.get("jpg", ref.get("png")) and s["cls"] == int(ref["cls"])
    img = shardsmith.open(tmp_path / "out", decode="numpy")[0]
    assert img.get("jpg", img.get("png")).ndim == 3
    info = json.loads(run_cli("inspect", tmp_path / "out", "--json").output)
    assert info["classes"] == ["ant", "bee", "cat"] and info["samples"][0]["members"]["cls"] in (0, 1, 2)
    res = run_cli("bench", tmp_path / "out", "--seconds", "0.2")
    assert res.exit_code == 0 and "samples/s" in res.output
    # beyond 1,000 inputs the manifest records their count, not their names
    manifest = tmp_path / "out" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["source"]["inputs"] = 1500
    manifest.write_text(json.dumps(m))
    res = run_cli("inspect", tmp_path / "out")
    assert res.exit_code == 0 and "1,500 input files" in res.output
    assert json.loads(run_cli("inspect", tmp_path / "out", "--json").output)["source"]["inputs"] == 1500


def test_jsonl_shards_respect_shard_bytes(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps({"text": "x" * (i % 700)}) + "\n" for i in range(300)))
    m = convert(tmp_path / "in", "-o", tmp_path / "out", "--shard-bytes", "30KB")
    sizes = [s["bytes"] for s in m["splits"]["train"]["shards"]]
    assert len(sizes) > 5 and max(sizes) <= 30_000 and sum(s["samples"] for s in m["splits"]["train"]["shards"]) == 300
    assert min(sizes[:-1]) > 30_000 - 2 * 10240  # full shards, not half-empty ones


@pytest.mark.parametrize("columns, message", [
    ({"json": [b"a"], "label": [1]}, "binary column 'json' would be the member .json"),
    ({"a.b": [b"a"], "a_b": [b"b"]}, "binary column 'a_b' would be the member .a_b"),
    ({"x" * 40: [b"a"]}, "longer than tar allows"),
])
def test_parquet_columns_that_make_bad_member_names_are_usage_errors(tmp_path, columns, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table(columns), tmp_path / "in" / "t.parquet")
    res = run_cli("convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "webdataset", "-q")
    assert res.exit_code == 2 and message in res.stderr, res.stderr


def test_parquet_files_whose_schemas_disagree(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"a": [1], "b": ["x"]}), tmp_path / "in" / "one.parquet")
    pq.write_table(pa.table({"a": [1], "c": [2.0]}), tmp_path / "in" / "two.parquet")
    res = run_cli("convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "webdataset", "-q")
    assert res.exit_code == 2 and "two.parquet: its columns (a, c) differ from those of one.parquet" in res.stderr
