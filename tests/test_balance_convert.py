"""``convert --balance``: seeded hash downsampling of majority classes (issue 16 point 5): at most N
per class, the kept set a function of the seed and the inputs only (the same for any --workers
and for the direct and shuffled image paths, and for cluster stages), counts before and after and the
dropped count in the manifest and the closing line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import jpeg, root_data, run_cli, tree_digest
from test_stages import one_process, staged

import shardsmith
from shardsmith.core.sample import Identity
from shardsmith.kit.downsample import balance_hashes

COUNTS = {"ant": 20, "bee": 6, "cat": 3}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imgs")
    for label, (cls, n) in enumerate(COUNTS.items()):
        (root / cls).mkdir()
        for i in range(n):
            (root / cls / f"{i:02d}.jpg").write_bytes(jpeg(label * 100 + i))
    return root


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("events")
    rng = np.random.default_rng(0)
    paths = []
    for k in range(3):
        label = rng.choice(3, size=200, p=[0.7, 0.2, 0.1]).astype(np.int64)
        table = pa.table({"label": label, "x": rng.standard_normal(200).astype(np.float32),
                          "event": np.arange(200, dtype=np.int64) + 1000 * k})
        pq.write_table(table, root / f"ev{k}.parquet", row_group_size=40)
        paths.append(root / f"ev{k}.parquet")
    return paths


def convert(*args, to: str = "webdataset") -> dict:
    res = run_cli("convert", *args, "--to", to, "--quiet")
    assert res.exit_code == 0, res.stderr
    out = Path(args[list(args).index("-o") + 1])
    return json.loads((out / "manifest.json").read_text())


def test_image_folders_keep_at_most_n_per_class_stable_for_any_workers(images, tmp_path):
    m = convert(images, "-o", tmp_path / "w1", "--balance", "max=5", "--seed", "3")
    assert m["balance"] == {"max": 5, "seed": 3, "before": {"ant": 20, "bee": 6, "cat": 3},
                            "after": {"ant": 5, "bee": 5, "cat": 3}, "dropped": 16}
    ds = shardsmith.open(tmp_path / "w1")
    assert np.bincount(ds.labels()).tolist() == [5, 5, 3] and m["splits"]["train"]["samples"] == 13
    keys = {ds[i]["__key__"] for i in range(len(ds))}
    # the bottom 5 balance hashes of each class, computed from the names alone
    want = set()
    for cls, n in COUNTS.items():
        rels = [f"{cls}/{i:02d}.jpg" for i in range(n)]
        h = balance_hashes(3, rels, np.zeros(n, np.int64))
        want |= {Identity(rels[j], 0).key() for j in np.argsort(h)[:5]}
    assert keys == want
    first = tree_digest(tmp_path / "w1")
    for workers in ("2", "3"):  # the shuffled path (--on-error skip) with several workers: the same bytes
        convert(images, "-o", tmp_path / workers, "--balance", "max=5", "--seed", "3", "--workers", workers,
                "--on-error", "skip")
        assert tree_digest(tmp_path / workers) == first
    convert(images, "-o", tmp_path / "more", "--balance", "max=8", "--seed", "3")
    more = shardsmith.open(tmp_path / "more")
    assert keys < {more[i]["__key__"] for i in range(len(more))}  # a larger N keeps a superset
    convert(images, "-o", tmp_path / "seed", "--balance", "max=5", "--seed", "4")
    other = shardsmith.open(tmp_path / "seed")
    assert keys != {other[i]["__key__"] for i in range(len(other))}
    m = convert(images, "-o", tmp_path / "ratio", "--balance", "ratio=1.5")
    assert m["balance"]["after"] == {"ant": 5, "bee": 5, "cat": 3}  # ceil(1.5 x 3)


def test_events_keep_the_lowest_hashes_of_each_label_for_any_workers(events, tmp_path):
    digests = []
    for workers in ("1", "2", "3"):
        m = convert(*events, "-o", tmp_path / workers, "--balance", "max=40,label=label", "--workers", workers,
                    "--memory", "64MB", to="hdf5")
        digests.append(tree_digest(tmp_path / workers))
    assert digests[0] == digests[1] == digests[2]
    before = m["balance"]["before"]
    assert m["balance"]["after"] == {k: min(v, 40) for k, v in before.items()} and sum(before.values()) == 600
    assert m["source"]["records"] == 600 and m["splits"]["train"]["samples"] == sum(m["balance"]["after"].values())
    ds = shardsmith.open(tmp_path / "1")
    kept = set(ds.get_batch(np.arange(len(ds))).fixed["event"].tolist())
    import pyarrow.parquet as pq

    want = set()
    tables = [pq.read_table(p).to_pydict() for p in events]
    for c in range(3):
        rows = [(int(balance_hashes(0, p.name, np.array([r]))[0]), t["event"][r])
                for p, t in zip(events, tables) for r in range(200) if t["label"][r] == c]
        want |= {e for _, e in sorted(rows)[:40]}
    assert kept == want


@pytest.mark.parametrize(("args", "message"), [
    (["--balance", "max=0"], "N must be >= 1"),
    (["--balance", "max=3,ratio=2"], "give --balance max=N or ratio=R"),
    (["--balance", "max=3,label=y"], "for events"),
])
def test_balance_usage_errors(images, tmp_path, args, message):
    res = run_cli("convert", images, "-o", tmp_path / "out", "--to", "webdataset", "--quiet", *args)
    assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_balance_needs_a_label_for_events_and_classes_for_rows(events, tmp_path):
    res = run_cli("convert", *events, "-o", tmp_path / "ev", "--to", "hdf5", "--quiet", "--balance", "max=5,label=x")
    assert res.exit_code == 2 and "integer field" in res.stderr
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": 1}\n')
    res = run_cli("convert", rows, "-o", tmp_path / "rows", "--to", "webdataset", "--quiet", "--balance", "max=5")
    assert res.exit_code == 2 and "image folders" in res.stderr


def test_root_events_balanced_by_an_integer_branch(tmp_path):
    """A real ROOT file, labels read through a reader of the label branch alone, into tar events."""
    m = convert(root_data() / "uproot-HZZ.root", "-o", tmp_path / "hzz", "--balance", "max=300,label=NPhoton",
                to="webdataset")
    assert m["balance"]["before"] == {"0": 2250, "1": 125, "2": 43, "3": 3}
    assert m["balance"]["after"] == {"0": 300, "1": 125, "2": 43, "3": 3}
    ds = shardsmith.open(tmp_path / "hzz")
    assert np.bincount(ds.labels("NPhoton")).tolist() == [300, 125, 43, 3]


def test_the_closing_line_counts_the_dropped_samples(images, events, tmp_path):
    res = run_cli("convert", images, "-o", tmp_path / "img", "--to", "webdataset", "--balance", "max=5", "-q")
    assert res.exit_code == 0, res.stderr
    assert "13 samples in 1 shard; 13 records read, 0 skipped; 16 samples dropped by --balance max=5" in res.output
    res = run_cli("convert", *events, "-o", tmp_path / "ev", "--to", "hdf5", "--balance", "ratio=2,label=label", "-q")
    assert res.exit_code == 0, res.stderr
    m = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    dropped = m["balance"]["dropped"]
    assert dropped == 600 - m["splits"]["train"]["events"] > 0
    assert f"600 records read, 0 skipped; {dropped} samples dropped by --balance ratio=2.0,label=label" in res.output


@pytest.mark.parametrize("kind", ["images", "events"])
def test_cluster_stages_give_the_bytes_of_one_machine(images, events, tmp_path, kind):
    """scatter on 2 ranks (one rerun), gather, finalize: the balanced shards and manifest of a one-process run."""
    if kind == "images":
        args = ["convert", images, "--to", "webdataset", "--balance", "max=5", "--seed", "3", "--shard-samples", "4",
                "--memory", "64KB", "-q"]
    else:
        args = ["convert", *events, "--to", "hdf5", "--balance", "max=40,label=label", "--shard-samples", "50",
                "--memory", "64KB", "-q"]
    one_process(args, tmp_path / "one")
    staged(args, tmp_path / "staged", 2)
    assert tree_digest(tmp_path / "staged") == tree_digest(tmp_path / "one")
    one, two = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("one", "staged"))
    assert one["balance"] == two["balance"] and two["balance"]["dropped"] > 0
    assert one["source"]["records"] == two["source"]["records"]
