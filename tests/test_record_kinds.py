"""Record kinds are registered (``kit/record_kind.py``): commands look a source's kind up and ask it,
a plugin adds its own (the example plugin's key/value ``pairs``) and ``convert`` writes it end to end,
and a source of a kind nobody registers is one line."""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli
from test_contracts import CSV_PLUGIN, csv_plugin_registered, properties_files

from shardsmith import registry
from shardsmith.kit.reader import Reader

PACKAGE = Path(__file__).resolve().parents[1] / "shardsmith"
needs_pairs = pytest.mark.skipif(not (CSV_PLUGIN / "shardsmith_csv" / "pairs.py").is_file(),
                                 reason="the example plugin's record kind is not in this tree")


class OddSource(Reader):
    """A plugin source of a kind no package registers."""

    name = "odd"
    suffixes = (".odd",)
    holds = "odd-things"


@pytest.fixture()
def odd_source() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_installed", lambda: (registry.Plugin("source", "odd", "test_record_kinds:OddSource",
                                                                    origin="shardsmith-odd"),))
        yield
    registry._installed.cache_clear()


def test_a_source_of_a_kind_nobody_registers_is_one_line(odd_source, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.odd").write_text("x\n")
    res = run_cli("convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "webdataset", "-q")
    err = res.stderr.strip()
    assert res.exit_code == 2 and "\n" not in err and "Traceback" not in err, res.stderr
    assert err == ("shardsmith: error: source 'odd' holds 'odd-things', a record kind no installed package "
                   "registers (kinds: events, images, rows)"), err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_builtin_kinds_are_registered_and_listed():
    assert {"rows", "images", "events"} <= set(registry.names("kind"))
    for name in ("rows", "images", "events"):
        kind = registry.record_kind(name)
        assert kind.name == name and kind.steps().__name__.endswith("Steps")
    res = run_cli("plugins")
    assert res.exit_code == 0 and re.search(r"^kind +rows +shardsmith\.kit\.kinds:RowsKind .* ok$", res.output, re.M), \
        res.output


def test_commands_ask_the_kind_and_never_compare_its_name():
    """``holds == "images"`` and the like, anywhere in the package: the kind is looked up and asked."""
    pattern = re.compile(r"""holds\s*[!=]=|[=!]=\s*["'](rows|images|events)["']""")
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
             for p in PACKAGE.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert not found, "record kinds compared by name:\n" + "\n".join(found)


@needs_pairs
def test_a_plugin_kind_converts_end_to_end_into_a_format_of_rows(tmp_path):
    """The example plugin's ``pairs``: convert takes the kind's steps, webdataset and the plugin's csv
    format write it (``written_as = "rows"``), and the values read back are the inputs'."""
    properties_files(tmp_path / "in")
    with csv_plugin_registered():
        for to in ("webdataset", "csv"):
            res = run_cli("convert", tmp_path / "in", "-o", tmp_path / to, "--to", to, "--shard-samples", "40", "-q")
            assert res.exit_code == 0, res.stderr
        refused = run_cli("convert", tmp_path / "in", "-o", tmp_path / "x", "--to", "webdataset",
                          "--transform", "select=key", "-q")
    expected = sorted(tuple(re.split(r"\s*[=:]\s*", line, maxsplit=1))
                      for f in sorted((tmp_path / "in").rglob("*.properties"))
                      for line in f.read_text().splitlines() if line and not line.startswith("#"))
    assert len(expected) == 105
    m = json.loads((tmp_path / "webdataset" / "manifest.json").read_text())
    assert m["source"]["reader"] == "properties" and m["source"]["records"] == 105
    assert m["plugins"]["kind pairs"].startswith("shardsmith-csv"), m["plugins"]  # the kind made these bytes
    got = []  # (sample key, pair) in the shards' order
    for shard in sorted((tmp_path / "webdataset").glob("train-*.tar")):
        with tarfile.open(shard) as tar:
            got += [(member.name.split(".")[0], json.loads(tar.extractfile(member).read()))  # type: ignore[union-attr]
                    for member in tar if member.name.endswith(".json")]
    assert sorted((d["key"], d["value"]) for _, d in got) == expected
    import csv

    rows = []
    for shard in sorted((tmp_path / "csv").glob("train-*.csv")):
        with open(shard, newline="", encoding="utf-8") as fh:
            rows += list(csv.DictReader(fh))
    assert [(r["__key__"], r["key"], r["value"]) for r in rows] == [(k, d["key"], d["value"]) for k, d in got], \
        "the csv format wrote other pairs, or another order, than webdataset"
    assert refused.exit_code == 2 and refused.stderr.strip() == (
        "shardsmith: error: --transform select: it applies to rows, and these inputs hold pairs"), refused.stderr


@needs_pairs
def test_a_plugin_kind_reports_its_raw_inputs(tmp_path):
    """``inspect INPUT... --report``: the kind's own section (its keys), after every source's Inputs."""
    pytest.importorskip("matplotlib")
    properties_files(tmp_path / "in")
    with csv_plugin_registered():
        res = run_cli("inspect", tmp_path / "in", "--report", tmp_path / "report")
    assert res.exit_code == 0, res.stderr
    html = next((tmp_path / "report").glob("*.html")).read_text()
    assert "Pairs" in html and "key.16" in html and "105 pairs read" in html, html[:2000]
