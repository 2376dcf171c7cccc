"""The dataset card (issue 17, point 3): ``README.md`` with the YAML HuggingFace ``datasets`` reads.

Loaded with the real ``datasets`` (5.2 here): an image webdataset with classes shows its
``ClassLabel`` names, JSONL text in tars its ``json`` and ``txt`` columns, HDF5 events their
fixed-shape fields (through ``datasets``' ``hdf5`` builder); token shards, which ``datasets`` cannot
read, get a card that describes them. The card is the same bytes wherever the run's files were,
holds no credentials, and is the user's to edit (``verify`` does not check it); ``--overwrite``
replaces it, and never a ``README.md`` of the user's.

``import datasets`` takes about 1.5 s: one test imports it, and loads the three datasets there.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from conftest import jpeg_folder, make_docs, run_cli, write_jsonl

from shardsmith.kit.dataset_card import command_line

GOLDEN_INPUTS = Path(__file__).parent / "golden" / "inputs"


def _front(card: Path) -> dict:
    yaml = pytest.importorskip("yaml", reason="the card's YAML is read with PyYAML (as datasets reads it)")
    text = card.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """Small datasets of each kind: images with classes, JSONL text in tars, HDF5 events, tokens, events in tars."""
    root = tmp_path_factory.mktemp("card")
    images = jpeg_folder(root / "images", classes=3, per_class=4)
    write_jsonl(root / "text" / "a.jsonl", make_docs(60, seed=1))
    made = {name: root / name for name in ("img", "txt", "h5", "tok", "ev")}
    for args in (
        ["convert", images, "--to", "webdataset", "--split", "train=0.75,val=0.25", "-o", made["img"]],
        ["convert", root / "text", "--to", "webdataset", "--text-field", "text", "--split", "train=0.8,val=0.2",
         "-o", made["txt"]],
        ["convert", GOLDEN_INPUTS / "hits.parquet", "--to", "hdf5", "--group-by", "event_id", "--events-table",
         GOLDEN_INPUTS / "events_meta.parquet", "--shard-samples", "12", "-o", made["h5"]],
        ["pack-tokens", root / "text", "--tokenizer", GOLDEN_INPUTS / "tokenizer.json", "--engine", "hf", "-o", made["tok"]],
        ["convert", GOLDEN_INPUTS / "hits.parquet", "--to", "webdataset", "--group-by", "event_id", "--shard-samples",
         "12", "-o", made["ev"]],
    ):
        res = run_cli(*args, "-q", "--workers", "1")
        assert res.exit_code == 0, res.stderr
    return made


def test_datasets_loads_the_folders_with_their_features(outputs, tmp_path):
    """``load_dataset(OUT)`` reads the card: class names, splits, the JSON and text columns, the
    fixed fields of HDF5 events; the token folder has a card but no builder in ``datasets``."""
    datasets = pytest.importorskip("datasets", reason="the dataset card is tested with HuggingFace datasets")
    datasets.disable_progress_bars()
    cache = str(tmp_path / "hf")

    def counts(out: Path) -> dict[str, int]:
        return {s: v["samples"] for s, v in orjson.loads((out / "manifest.json").read_bytes())["splits"].items()}

    img = datasets.load_dataset(str(outputs["img"]), cache_dir=cache)
    assert {s: len(d) for s, d in img.items()} == counts(outputs["img"]) and sum(counts(outputs["img"]).values()) == 12
    assert img["train"].features["cls"].names == ["c0", "c1", "c2"]
    first = img["train"][0]
    assert first["jpg"].size == (48, 40) and 0 <= first["cls"] < 3
    assert img["train"].features["cls"].int2str(first["cls"]) == f"c{first['cls']}"

    txt = datasets.load_dataset(str(outputs["txt"]), cache_dir=cache)
    assert {s: len(d) for s, d in txt.items()} == counts(outputs["txt"])
    row = txt["train"][0]
    assert row["txt"] == row["json"]["text"] and row["txt"].startswith("doc ")

    h5 = datasets.load_dataset(str(outputs["h5"]), cache_dir=cache)
    assert len(h5["train"]) == 27 and set(h5["train"].features) == {"event_id", "label"}
    from shardsmith.loader import open as open_dataset

    ours = open_dataset(outputs["h5"], split="train")
    for field in ("event_id", "label"):  # every fixed field, value for value
        assert h5["train"][field] == [ours[i][field].item() for i in range(len(ours))], field

    with pytest.raises(datasets.exceptions.DataFilesNotFoundError):  # no builder reads .bin/.idx: said on the card
        datasets.load_dataset(str(outputs["tok"]), cache_dir=cache)
    front = _front(outputs["tok"] / "README.md")
    assert "configs" not in front
    assert datasets.Features._from_yaml_list(front["dataset_info"]["features"]) == datasets.Features(
        {"tokens": datasets.List(datasets.Value("uint16"))})


def test_the_webdataset_builder_reads_the_tar_folders(outputs, tmp_path):
    """``load_dataset("webdataset", data_dir=OUT)``: ``datasets`` skips ``__index__/`` (where the offset
    and wids indexes are) and reads the tars, in our order; it reads no card, so ``cls`` is a plain
    int there and the card's features, passed as ``features=``, give the class names. Events in tars
    come as one row per event, each ``.npy`` member a column (``datasets`` infers their types)."""
    datasets = pytest.importorskip("datasets", reason="the webdataset builder is tested with HuggingFace datasets")
    datasets.disable_progress_bars()
    from shardsmith.loader import open as open_dataset

    cache = str(tmp_path / "hf")

    def load(name: str, **kw):
        ds = datasets.load_dataset("webdataset", data_dir=str(outputs[name]), split="train", cache_dir=cache, **kw)
        ours = open_dataset(outputs[name], split="train")
        assert ds["__key__"] == [ours[i]["__key__"] for i in range(len(ours))], name
        return ds, ours

    img, ours = load("img")
    assert len(img) == 8 and img.features["cls"] == datasets.Value("int64")
    assert [(row["jpg"].size, row["cls"]) for row in img] == [((48, 40), s["cls"]) for s in ours]
    features = datasets.Features._from_yaml_list(_front(outputs["img"] / "README.md")["dataset_info"]["features"])
    named, _ = load("img", features=features)
    assert named.features["cls"].names == ["c0", "c1", "c2"] and named["cls"] == img["cls"]
    both = datasets.load_dataset("webdataset", data_dir=str(outputs["img"]), cache_dir=cache)
    assert {s: len(d) for s, d in both.items()} == {"train": 8, "validation": 4}  # its name for our "val"

    txt, ours = load("txt")
    assert [(row["txt"], row["json"]) for row in txt] == [(s["txt"], s["json"]) for s in ours]

    ev, ours = load("ev")
    assert len(ev) == 27 and set(ev.features) == {"event_id.npy", "x.npy", "y.npy", "__key__", "__url__"}
    for row, event in zip(ev, ours):
        assert row["event_id.npy"] == int(event["event_id"]) and row["x.npy"] == event["x"].tolist()
        assert row["y.npy"] == pytest.approx(event["y"].tolist())


def test_the_card_says_counts_files_and_command(outputs):
    for name, out in outputs.items():
        text = (out / "README.md").read_text(encoding="utf-8")
        manifest = orjson.loads((out / "manifest.json").read_bytes())
        front = _front(out / "README.md")
        assert [(s["name"], s["num_examples"]) for s in front["dataset_info"]["splits"]] == [
            (s, v["samples"]) for s, v in manifest["splits"].items()], name
        for split in manifest["splits"].values():
            for shard in split["shards"]:
                assert f"| {shard['path']} | {shard['bytes']} | `{shard['sha256']}` |" in text
        assert "\nshardsmith " in text and "--workers 1" in text
        assert str(out.parent) not in text, "no absolute path"
    assert "| 0 | c0 |" in (outputs["img"] / "README.md").read_text()
    for name in ("img", "txt", "ev"):  # what the webdataset builder reads, and what it does not
        text = " ".join((outputs[name] / "README.md").read_text().split())
        assert "`__index__/`, which `datasets` skips" in text, name
        assert ("`features=`" in text) == (name == "img"), name
    assert "`x`, `y`" in (outputs["h5"] / "README.md").read_text(), "the ragged fields datasets cannot read"


def test_the_card_is_the_same_bytes_anywhere_and_verify_leaves_it_to_the_user(outputs, tmp_path):
    again = tmp_path / "elsewhere" / "img"
    res = run_cli("convert", outputs["img"].parent / "images", "--to", "webdataset", "--split", "train=0.75,val=0.25",
                  "-o", again, "-q", "--workers", "1")
    assert res.exit_code == 0, res.stderr
    assert (again / "README.md").read_bytes() == (outputs["img"] / "README.md").read_bytes()
    with open(again / "README.md", "a") as fh:
        fh.write("\nNotes of the user.\n")
    assert run_cli("verify", again).exit_code == 0  # a card is documentation: edited, the dataset is intact
    res = run_cli("convert", outputs["img"].parent / "images", "--to", "webdataset", "-o", again, "-q", "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert "Notes of the user" not in (again / "README.md").read_text()
    assert [d["split"] for d in _front(again / "README.md")["configs"][0]["data_files"]] == ["train"]


def test_a_readme_of_the_users_is_never_removed(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(10, seed=1))
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    for extra in ([], ["--overwrite"]):
        res = run_cli("convert", tmp_path / "in", "--to", "webdataset", "-o", out, "-q", *extra)
        assert res.exit_code == 2 and ("README.md" in res.stderr or "not empty" in res.stderr), res.stderr
        assert (out / "README.md").read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["README.md"]


def test_the_command_line_holds_no_secret_and_no_absolute_path():
    line = command_line(["/venv/bin/shardsmith", "convert", "s3://KEY:SECRET@bucket/in?X-Amz-Signature=abc",
                         "--tokenizer=https://u:p@host/t.json?sig=1", "/home/someone/data/images", "-o",
                         "C:\\Users\\x\\out", "--split", "train=0.9,val=0.1"])
    assert line == ("shardsmith convert s3://bucket/in --tokenizer=https://host/t.json images -o out "
                    "--split train=0.9,val=0.1")


def test_a_memmap_card_shows_the_np_memmap_recipe_and_load_dataset_says_why_not(tmp_path):
    """The card's numpy recipe runs as written in the folder; ``load_dataset`` fails with the card's sentence."""
    import re
    import subprocess
    import sys

    pytest.importorskip("uproot")
    datasets = pytest.importorskip("datasets")
    from shardsmith.demo.root_files import make_icecube_like

    root = make_icecube_like(tmp_path / "run.root", events=200, mean_pulses=5, seed=0)
    out = tmp_path / "mm"
    assert run_cli("convert", root, "-o", out, "--to", "memmap", "--max-len", "4", "-q").exit_code == 0
    card = (out / "README.md").read_text()
    recipe = re.search(r"With numpy alone.*?```python\n(.*?)```", card, flags=re.S).group(1)
    res = subprocess.run([sys.executable, "-W", "error", "-c",  # no warning (an unclosed file: ResourceWarning)
                          recipe + "\nprint(values.shape, int(mask.sum()))"], cwd=out,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stderr, res.stderr
    assert res.stdout.split()[:3] == ["(200,", "4,", "6)"], res.stdout
    with pytest.raises(FileNotFoundError, match="memmap arrays are read with np.memmap or shardsmith.open, not "
                                                "HuggingFace datasets - see README.md"):
        datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))


# -- what load_dataset returns is the input, value for value (issue 42, item 5) ----------------------

EXACT_ROWS = [  # floats of every exponent (shortest repr round trips), ints beyond 2**53, nesting, nulls
    {"text": "a", "x": 0.7288508165275867, "tiny": 1.5e-12, "sub": 5e-324, "huge": 1.7976931348623157e308,
     "neg": -0.0, "big": 2**53 + 1, "low": -(2**63), "top": 2**63 - 1, "ok": True,
     "nest": {"list": [1.0, 2.5e-300, None], "deeper": {"s": "é\u2603", "ll": [[1, -2], []]}}, "none": None},
    {"text": "b", "x": 1e-320, "tiny": -1.2345678901234567e-200, "sub": 2.2250738585072014e-308, "huge": 1e300,
     "neg": -1e-7, "big": -(2**62) - 3, "low": 0, "top": 9007199254740993, "ok": False,
     "nest": {"list": [], "deeper": None}, "none": None},
    {"text": "c", "x": 3.0, "tiny": 0.1, "sub": 0.30000000000000004, "huge": 123456789.12345679,
     "neg": 4.9406564584124654e-324, "big": 1, "low": -1, "top": 12, "ok": True,
     "nest": {"list": [None], "deeper": {"s": "", "ll": [[0]]}}, "none": None},
]


def _same_json(got, want) -> bool:
    """Equal value for value, bit for bit: json.dumps writes each float's shortest exact repr
    (-0.0 and 1.0 apart from 0.0 and 1), and the keys in order."""
    import json

    return json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.fixture(scope="module")
def row_outputs(tmp_path_factory) -> dict[str, Path]:
    """JSONL rows of one exact type; rows without one (an int and a float at one place, a key that one
    row lacks, an int of 2**63); JPEGs and PNGs in one image folder."""
    import json

    root = tmp_path_factory.mktemp("exact")
    (root / "rows").mkdir()
    (root / "rows" / "a.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in EXACT_ROWS * 4))
    (root / "mixed").mkdir()
    (root / "mixed" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"text": "a", "v": 1, "w": 2**63}, {"text": "b", "v": 1.5, "w": 1}, {"text": "c", "v": 2}]))
    images = jpeg_folder(root / "images", classes=2, per_class=3)
    from PIL import Image

    for c in range(2):
        Image.new("RGB", (7, 5), (40 * c, 90, 200)).save(images / f"c{c}" / "p.png")
    made = {name: root / f"{name}-out" for name in ("rows", "mixed", "images")}
    for name, extra in (("rows", ["--text-field", "text"]), ("mixed", ["--text-field", "text"]), ("images", [])):
        res = run_cli("convert", root / name, "--to", "webdataset", "-o", made[name], "-q", "--workers", "1", *extra)
        assert res.exit_code == 0, res.stderr
    return made


def test_load_dataset_returns_every_json_value_exactly(row_outputs, tmp_path):
    """The card types the ``json`` column from the rows (a struct of float64, int64, bool, string,
    lists, nulls): ``load_dataset(OUT)`` gives every row back bit for bit, and so does
    ``data_dir=`` given the card's features. (The card named ``datasets``' ``json`` type, which
    keeps 10 decimals: 0.7288508165275867 came back 0.7288508165, 1.5e-12 as 0.0, 1e308 as inf.)"""
    datasets = pytest.importorskip("datasets", reason="the dataset card is tested with HuggingFace datasets")
    datasets.disable_progress_bars()
    out = row_outputs["rows"]
    front = _front(out / "README.md")
    json_feature = next(f for f in front["dataset_info"]["features"] if f["name"] == "json")
    assert "struct" in json_feature, json_feature
    want = {r["text"]: r for r in EXACT_ROWS}
    features = datasets.Features._from_yaml_list(front["dataset_info"]["features"])
    for ds in (datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "a")),
               datasets.load_dataset("webdataset", data_dir=str(out), split="train", features=features,
                                     cache_dir=str(tmp_path / "b"))):
        assert len(ds) == 12
        for row in ds:
            assert row["txt"] == row["json"]["text"]
            assert _same_json(row["json"], want[row["txt"]]), (row["json"], want[row["txt"]])


def test_rows_of_no_one_exact_type_are_left_out_of_the_card_not_rounded(row_outputs, tmp_path):
    """An int and a float at one place (1 would come back 1.0), a key one row lacks (None), an int of
    2**63 (``datasets`` writes ints through int64): no type keeps them, so the card names no ``json``
    column and says why; what ``load_dataset`` returns is the rest, exactly."""
    datasets = pytest.importorskip("datasets", reason="the dataset card is tested with HuggingFace datasets")
    datasets.disable_progress_bars()
    out = row_outputs["mixed"]
    names = [f["name"] for f in _front(out / "README.md")["dataset_info"]["features"]]
    assert names == ["txt", "__key__", "__url__"]
    text = " ".join((out / "README.md").read_text().split())
    assert "The `json` members (each row as it was read) are not a column here" in text
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert sorted(ds["txt"]) == ["a", "b", "c"] and set(ds.features) == {"txt", "__key__", "__url__"}


def test_an_image_folder_of_jpeg_and_png_loads_through_its_card_byte_for_byte(row_outputs, tmp_path):
    """Images of two types are a column each: ``load_dataset(OUT)`` (and ``data_dir=`` with the card's
    features) gives each sample its image, the input file's bytes, in its type's column and None in
    the other; the card says that ``data_dir=`` alone infers the columns from the first samples and
    fails (or drops the other type's images)."""
    datasets = pytest.importorskip("datasets", reason="the dataset card is tested with HuggingFace datasets")
    datasets.disable_progress_bars()
    from shardsmith.loader import open as open_dataset

    out = row_outputs["images"]
    source = out.parent / "images"
    front = _front(out / "README.md")
    features = datasets.Features._from_yaml_list(front["dataset_info"]["features"])
    assert {"jpg", "png", "cls"} <= set(features)
    text = " ".join((out / "README.md").read_text().split())
    assert "The images here are of 2 types (" in text and "`jpg`" in text and "`png`" in text
    assert "without `features=` it fails on samples whose members differ" in text
    ours = open_dataset(out, split="train")
    files = {s["__key__"]: s for s in (ours[i] for i in range(len(ours)))}
    undecoded = {"jpg": datasets.Image(decode=False), "png": datasets.Image(decode=False)}
    for ds in (datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "a")),
               datasets.load_dataset("webdataset", data_dir=str(out), split="train", features=features,
                                     cache_dir=str(tmp_path / "b"))):
        ds = ds.cast(datasets.Features({**ds.features, **undecoded}))
        assert len(ds) == 8 and sum(row["png"] is not None for row in ds) == 2
        for row in ds:
            ext = "png" if row["png"] is not None else "jpg"
            assert row["jpg" if ext == "png" else "png"] is None
            sample = files[row["__key__"]]
            assert row[ext]["bytes"] == sample[ext] and row["cls"] == sample["cls"]
            assert sample[ext] in {p.read_bytes() for p in source.glob(f"c{row['cls']}/*.{ext}")}
