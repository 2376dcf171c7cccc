"""``shardsmith inspect --report``: the HTML report of every format and of raw inputs, as a user runs it.

Each report's PNGs are opened with Pillow (valid images of a sane size), its numbers are looked
for as text in the HTML, and strings from data (a crafted class name) come out escaped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from PIL import Image

from shardsmith.errors import install_hint
from shardsmith.kit import manifest_io
from tests.conftest import jpeg_folder, make_docs, run_cli, write_jsonl

pytest.importorskip("matplotlib")

CRAFTED = "<img src=x onerror=alert(1)>"


def _report(*args: str | Path) -> tuple[str, list[Path]]:
    """Run inspect --report; the HTML and its PNG files, each checked to be a real image."""
    folder = Path(str(args[-1]))
    res = run_cli("inspect", *args[:-1], "--report", folder)
    assert res.exit_code == 0, res.output + res.stderr
    page = (folder / "report.html").read_text()
    pngs = sorted(folder.glob("*.png"))
    assert pngs and page.count("data:image/png;base64,") == len(pngs)
    for png in pngs:
        assert png.stat().st_size > 5_000, png
        with Image.open(png) as im:
            im.verify()
        with Image.open(png) as im:
            assert im.format == "PNG" and 400 <= im.width <= 2000 and 200 <= im.height <= 2000, (png, im.size)
    assert "<script" not in page
    return page, pngs


def _text(page: str) -> str:
    """The page's text without tags and embedded images."""
    return re.sub(r"<[^>]+>", " ", re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    write_jsonl(root / "a.jsonl", make_docs(300, seed=1, max_words=200))
    return root


def test_tokens_report(corpus: Path, bpe_tokenizer: Path, tmp_path: Path) -> None:
    out = tmp_path / "tok"
    assert run_cli("pack-tokens", corpus, "-o", out, "--tokenizer", bpe_tokenizer, "--seq-len", "64",
                   "--quiet").exit_code == 0
    page, pngs = _report(out, "--seq-len", "100", tmp_path / "r")
    text = _text(page)
    m = orjson.loads((out / "manifest.json").read_bytes())
    lengths = np.concatenate([np.fromfile(out / s["index"]["path"], np.int32, offset=34, count=s["samples"])
                              for s in m["splits"]["train"]["shards"]])
    longer = int((lengths > 100).sum())
    assert f"{longer:,} of {len(lengths):,}" in text and "seq_len 100" in text
    assert f"{m['splits']['train']['tokens']:,}" in text
    assert "Most frequent tokens" in text and "document-lengths" in " ".join(p.name for p in pngs)
    assert "&#x27;" in page or "&quot;" in page or "'" in text  # decoded tokens shown as repr


def test_packed_tokens_report(corpus: Path, bpe_tokenizer: Path, tmp_path: Path) -> None:
    out = tmp_path / "packed"
    assert run_cli("pack-tokens", corpus, "-o", out, "--tokenizer", bpe_tokenizer, "--seq-len", "128",
                   "--pack", "best-fit", "--quiet").exit_code == 0
    page, _ = _report(out, tmp_path / "r")
    p = orjson.loads((out / "manifest.json").read_bytes())["packing"]
    text = _text(page)
    assert f"{p['padding_fraction']:.2%}" in text and f"{p['documents_split']:,} of {p['documents']:,}" in text
    assert "document pieces" in text


def test_images_report_escapes_class_names(tmp_path: Path) -> None:
    src = jpeg_folder(tmp_path / "img", classes=2, per_class=6)
    (src / "c1").rename(src / CRAFTED)
    (src / "c0" / "big.jpg").write_bytes(__import__("tests.conftest", fromlist=["jpeg"]).jpeg(7, (120, 90)))
    out = tmp_path / "wds"
    assert run_cli("convert", src, "-o", out, "--to", "webdataset", "--shard-samples", "4", "--quiet").exit_code == 0
    page, pngs = _report(out, tmp_path / "r")
    assert CRAFTED not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    text = _text(page)
    assert re.search(r"\b1\s+c0\s+7\s+7\b", text)  # label (classes sorted: "<" before "c"), class, split, total
    assert "120" in text and "90" in text and "Images per class" in text
    assert {"class-counts", "image-sizes", "bytes-per-image", "shard-sizes"} <= {p.stem[3:] for p in pngs}


def test_jsonl_tar_report(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "rows"
    assert run_cli("convert", corpus, "-o", out, "--to", "webdataset", "--text-field", "text",
                   "--quiet").exit_code == 0
    page, _ = _report(out, tmp_path / "r")
    text = _text(page)
    assert "member .json" in text and "member .txt" in text and "all 300 samples" in text
    from shardsmith.formats.webdataset.report import tar_sections
    from shardsmith.kit.sections.model import Sampling

    (late,) = tar_sections(out, manifest_io.load(out), Sampling(seconds=0.0))  # the deadline: said, not hidden
    assert "Stopped at the time limit (0 s) after 0" in late.notes[0]


def _events_root(path: Path) -> Path:
    """A small ROOT tree: a label, a float with NaN and infinities, and a jagged branch."""
    ak = pytest.importorskip("awkward")
    uproot = pytest.importorskip("uproot")
    rng = np.random.default_rng(0)
    n = 400
    x = rng.normal(size=n).astype(np.float32)
    x[:5] = np.nan
    x[5:7] = np.inf
    hits = ak.Array([rng.uniform(0, 10, size=k).astype(np.float32) for k in rng.integers(0, 6, size=n)])
    with uproot.recreate(path) as f:
        f["events"] = {"label": (np.arange(n) % 3).astype(np.int32), "x": x, "hits": hits}
    return path


@pytest.fixture(scope="module")
def root_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _events_root(tmp_path_factory.mktemp("root") / "ev.root")


@pytest.mark.parametrize("to", [["--to", "hdf5"], ["--to", "webdataset", "--events-per-sample", "3"],
                                ["--to", "memmap", "--max-len", "8"]],
                         ids=["hdf5", "event-tar", "memmap"])
def test_events_report(root_file: Path, tmp_path: Path, to: list[str]) -> None:
    out = tmp_path / "ev"
    assert run_cli("convert", root_file, "-o", out, *to, "--quiet").exit_code == 0
    page, pngs = _report(out, tmp_path / "r")
    text = _text(page)
    assert re.search(r"\bx\s+per event\s+&lt;f4\s+scalar\s+400\s+5\s+2\s+0\b", text), text[:3000]  # NaN, +inf, -inf
    assert re.search(r"Field label .*?\b0\s+134\b.*?\b1\s+133\b.*?\b2\s+133\b", text)  # label balance
    assert "Multiplicity" in text and any("multiplicity" in p.name for p in pngs)


def test_raw_inputs_report(corpus: Path, root_file: Path, tmp_path: Path) -> None:
    images = jpeg_folder(tmp_path / "img", classes=3, per_class=4)
    page, _ = _report(images, tmp_path / "r-img")
    assert re.search(r"\b2\s+c2\s+4\s+4\b", _text(page)) and "exact" in page
    page, _ = _report(corpus, tmp_path / "r-jsonl")
    text = _text(page)
    assert "300 records read" in text and re.search(r"\btext\s+300\s+100.0%\s+str 300\b", text)
    page, _ = _report(root_file, tmp_path / "r-root")
    text = _text(page)
    assert "400 events read" in text and "Label balance" in text


def test_big_jsonl_is_sampled_from_line_starts(corpus: Path) -> None:
    """A JSONL file bigger than a range is read from seeded offsets, each from the next line on,
    without the pass that counts its lines (the bound that keeps a 10 GB input under a minute)."""
    from shardsmith.engine.inputs.files import discover
    from shardsmith.sources.jsonl import JsonlReader

    reader = JsonlReader()
    (f,) = discover([str(corpus)], suffixes=reader.suffixes)
    data = Path(f.path).read_bytes()
    tasks = reader.sample_tasks(f, count=5, chunk_bytes=4096, rng=np.random.default_rng(0))
    assert 1 <= len(tasks) <= 5 and all(data[t.start - 1:t.start] == b"\n" for t in tasks)
    for t in tasks:
        first = next(iter(reader.read(t)))[1]
        assert isinstance(first, dict) and first["text"] == make_docs(300, seed=1, max_words=200)[first["id"]]


def test_raw_inputs_need_report_and_matplotlib_hint(corpus: Path, tmp_path: Path) -> None:
    res = run_cli("inspect", corpus)
    assert res.exit_code == 2 and "--report" in res.stderr
    code = ("import sys; sys.modules['matplotlib'] = None; from shardsmith.cli import main; "
            "sys.argv = ['shardsmith', 'inspect', sys.argv[1], '--report', sys.argv[2]]; main()")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code, str(corpus), str(tmp_path / "r")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"shardsmith: error: the report needs matplotlib, which is not installed: {install_hint('report')}"]
    assert not (tmp_path / "r").exists()


def test_data_on_a_grid_get_one_grid_value_a_bin_or_the_same_count():
    """Whole numbers and positions on a grid: equal-width bins would take one or two values by turns."""
    from shardsmith.kit.sections.figures import grid_edges, grid_step

    counts = np.arange(0, 101)  # 0..100: 101 integers
    assert grid_step(counts.astype(np.float64)) == 1.0
    edges = grid_edges(0, 100, 1.0, 40)
    per_bin = np.histogram(counts, bins=edges)[0]
    assert set(per_bin[:-1].tolist()) == {3} and per_bin[-1] == 2  # 3 integers a bin; the last holds what is left
    z = -500 + 17.0 * np.arange(60)  # detector positions every 17 m
    assert grid_step(np.repeat(z, 3)) == pytest.approx(17.0)
    per_bin = np.histogram(z, bins=grid_edges(z.min(), z.max(), 17.0, 40))[0]
    assert set(per_bin.tolist()) == {2}
    assert grid_step(np.random.default_rng(0).random(500)) is None  # continuous: ordinary bins


def test_events_report_fields_constant_fields_and_unknown_names(tmp_path):
    pytest.importorskip("uproot")
    from shardsmith.demo.root_files import make_icecube_like

    root = make_icecube_like(tmp_path / "run.root", events=300, mean_pulses=5, seed=0)
    out = tmp_path / "ev"
    assert run_cli("convert", root, "-o", out, "--to", "hdf5", "-q").exit_code == 0
    res = run_cli("inspect", out, "--report", tmp_path / "r", "--fields", "zenith,pulses_time")
    assert res.exit_code == 0, res.stderr
    page = (tmp_path / "r" / "report.html").read_text()
    assert "Drawn: the fields --fields names (2 of 10)" in page
    res = run_cli("inspect", out, "--report", tmp_path / "r2", "--fields", "zenith,nope")
    assert res.exit_code == 2 and "--fields: no field 'nope' in these events (fields: event_id" in res.stderr
    for shard in out.glob("*.h5"):  # the names are checked from the manifest, before any event is read
        shard.write_bytes(b"")
    res = run_cli("inspect", out, "--report", tmp_path / "r3", "--fields", "nope")
    assert res.exit_code == 2 and res.stderr.startswith("shardsmith: error: --fields: no field 'nope'"), res.stderr


def test_log_bins_of_whole_numbers_hold_whole_runs_that_never_shrink():
    """Lengths and byte counts on a log axis: rounded geometric edges gave bins of 1 and 2 values
    by turns (bars alternating by 2x) and, unrounded, bins between two integers (gaps)."""
    from shardsmith.kit.sections.figures import log_grid_edges

    for lo, hi in [(1, 29), (7, 230), (1, 2_000_000), (200, 10_000), (2_107, 2_156)]:
        edges = log_grid_edges(lo, hi, 1.0, 50)
        widths = np.diff(edges)
        assert edges[0] == lo - 0.5 and edges[-1] == hi + 0.5, (lo, hi)
        assert np.all(edges == np.round(edges - 0.5) + 0.5), (lo, hi)  # between integers, never on one
        assert np.all(widths[:-1] >= 1) and np.all(np.diff(widths[:-1]) >= 0), (lo, hi, widths)
        assert len(widths) <= 52, (lo, hi, len(widths))
    assert np.array_equal(log_grid_edges(1, 29, 1.0, 50), np.arange(30) + 0.5)  # few values: one bin each
    mb = log_grid_edges(0.002107, 0.002156, 1e-6, 50)  # bytes as MB: the same grid, scaled
    assert np.allclose(mb * 1e6, log_grid_edges(2_107, 2_156, 1.0, 50))


def _axes():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


@pytest.mark.parametrize("lo,hi", [(7, 1024), (1, 2_000_000), (200, 10_000), (2_107, 2_156), (0.3, 0.9)])
def test_log_axes_have_tick_labels_that_do_not_run_into_each_other(lo, hi):
    from shardsmith.kit.sections.figures import _hist_into

    fig, ax = _axes()
    values = np.geomspace(lo, hi, 500)
    _hist_into(ax, np.round(values) if lo >= 1 else values, bins=50, log_x=True)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    shown = [t for t in ax.get_xticklabels(minor=False) + ax.get_xticklabels(minor=True)
             if t.get_text() and t.get_visible() and lo * 0.9 <= t.get_position()[0] <= hi * 1.1]
    assert len(shown) >= 2, [t.get_text() for t in shown]
    boxes = sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0)
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in shown]


def test_one_value_is_one_labelled_bar_and_whole_numbers_get_whole_ticks():
    from shardsmith.kit.sections.figures import _hist_into

    fig, ax = _axes()
    _hist_into(ax, np.full(50, 256.0), bins=50, log_x=True)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["256"]  # not -0.4 ... 0.6 around a bin of width 1
    assert [t.get_text() for t in ax.texts] == ["all 50 values are 256"]
    fig, ax = _axes()
    _hist_into(ax, np.random.default_rng(0).integers(0, 7, 300).astype(np.float64), bins=50, log_x=False)
    fig.canvas.draw()
    ticks = [t.get_position()[0] for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(t == round(t) for t in ticks)
    assert len(ax.patches) == 7 and all(p.get_width() == 1 for p in ax.patches)  # a bar per integer, centred


def test_event_fields_constant_ones_as_text_and_the_ones_left_out_named():
    from shardsmith.core.events import EventSchema
    from shardsmith.kit.sections.event_stats import MAX_PANELS, EventSample, event_sections

    names = [f"f{i:02d}" for i in range(MAX_PANELS + 2)] + ["flat"]
    sample = EventSample(schema=EventSchema.from_json({n: {"dtype": "<f4", "shape": [], "ragged": False}
                                                       for n in names}))
    rng = np.random.default_rng(0)
    columns = {n: rng.normal(size=40).astype(np.float32) for n in names}
    columns["flat"] = np.full(40, 3.0, np.float32)
    sample.add(40, columns, {})
    (fields,) = [s for s in event_sections(sample, said="40 events.") if s.title == "Fields"]
    notes = " ".join(fields.notes)
    assert "Constant in the events read (not drawn): flat = 3." in notes
    assert f"2 fields not drawn ({MAX_PANELS} at most): f24, f25." in notes and "--fields" in notes
    assert len(fields.figures) == 2 and len(fields.tables[0].rows) == len(names)  # 12 + 12 panels; all in the table
    (chosen,) = [s for s in event_sections(sample, said="", fields=("f25", "flat")) if s.title == "Fields"]
    assert len(chosen.figures) == 1 and "flat = 3." in " ".join(chosen.notes)
    assert "Drawn: the fields --fields names (2 of 27)" in " ".join(chosen.notes)


def test_fields_only_with_a_report_of_events(corpus: Path, tmp_path: Path) -> None:
    res = run_cli("inspect", corpus, "--fields", "text")
    assert res.exit_code == 2 and res.stderr.strip().splitlines() == [
        "shardsmith: error: --fields chooses the fields a report draws: give --report DIR too"]
    res = run_cli("inspect", corpus, "--report", tmp_path / "r", "--fields", "text")
    assert res.exit_code == 2 and res.stderr.strip().splitlines() == [
        "shardsmith: error: --fields chooses the event fields a report draws; these jsonl inputs hold rows, not events"]
    assert not (tmp_path / "r").exists()
