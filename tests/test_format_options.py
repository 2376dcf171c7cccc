"""Each format owns its options (issue 27): declared in a light module (``kit/options.py``), shown
under "Options for --to NAME" in ``convert --help``, refused with another ``--to`` (one line, exit
2), handed to the writer as ``job.options`` and recorded in the manifest; a format written before
formats declared options still works (``job.opts.NAME``, with a DeprecationWarning)."""

from __future__ import annotations

import json
import pickle
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, write_jsonl

from shardsmith import registry
from shardsmith.commands.convert_options import ConvertOptions
from shardsmith.engine.output.resume import run_identity
from shardsmith.errors import UsageError
from shardsmith.formats.webdataset.format import WebDatasetFormat
from shardsmith.kit.options import SHARD_SIZE, FormatOptions, Option, OptionValues


@pytest.fixture()
def text(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "in" / "a.jsonl", [f"document {i}" for i in range(6)])


def one_line(res: Any, code: int) -> str:
    assert res.exit_code == code, (res.exit_code, res.output, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def sections(help_text: str) -> dict[str, str]:
    """The help's sections by heading ("Options", "Options for --to hdf5", ...)."""
    out: dict[str, str] = {}
    heading = None
    for line in help_text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
            out[heading] = ""
        elif heading is not None:
            out[heading] += line + "\n"
    return out


def test_help_shows_each_format_s_options_under_its_to():
    res = run_cli("convert", "--help")
    assert res.exit_code == 0, res.stderr
    found = sections(res.output)
    assert {"Options", "Options for --to hdf5", "Options for --to memmap", "Options for --to webdataset"} <= set(found)
    for flag in ("--max-len", "--dtype", "--keep"):
        assert flag in found["Options for --to memmap"] and flag not in found["Options"]
    assert "--compression" in found["Options for --to hdf5"]
    for flag in ("--wids-md5", "--events-per-sample"):
        assert flag in found["Options for --to webdataset"] and flag not in found["Options for --to hdf5"]
    for section in ("Options for --to hdf5", "Options for --to webdataset"):  # shared: in both
        assert "--shard-samples" in found[section] and "--shard-bytes" in found[section]
    assert "--shard-bytes" not in found["Options"] and "--shard-bytes" not in found["Options for --to memmap"]
    assert "--seed" in found["Options"] and "--branches" in found["Options"]


@pytest.mark.parametrize("args, says", [
    (["--to", "hdf5", "--max-len", "4"], "--max-len applies to --to memmap only, not to --to hdf5"),
    (["--to", "hdf5", "--wids-md5"], "--wids-md5 applies to --to webdataset only, not to --to hdf5"),
    (["--to", "memmap", "--compression", "gzip"], "--compression applies to --to hdf5 only, not to --to memmap"),
    (["--to", "memmap", "--shard-bytes", "1MB"], "--shard-bytes applies to --to hdf5, lance, mds, parquet, webdataset only, not to --to memmap"),
    (["--to", "webdataset", "--dtype", "float16"], "--dtype applies to --to memmap only, not to --to webdataset"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_an_option_of_another_to_is_refused_in_one_line(tmp_path, text, args, says):
    res = run_cli("convert", text, "-o", tmp_path / "out", *args, "-q")
    assert one_line(res, 2) == f"shardsmith: error: {says}"
    assert not (tmp_path / "out").exists()


def test_an_option_of_another_to_left_at_its_default_is_no_error(tmp_path, text):
    res = run_cli("convert", text, "-o", tmp_path / "out", "--to", "webdataset", "--keep", "first",
                  "--compression", "none", "--events-per-sample", "1", "-q")
    assert res.exit_code == 0, res.stderr


def test_an_option_of_the_same_to_for_other_records_is_refused(tmp_path, text):
    res = run_cli("convert", text, "-o", tmp_path / "out", "--to", "webdataset", "--events-per-sample", "2", "-q")
    assert one_line(res, 2) == ("shardsmith: error: --events-per-sample does not apply to --to webdataset for rows "
                                "(it applies to events)")


def test_a_recipe_dry_run_refuses_an_option_of_another_to(tmp_path, text):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'command = "convert"\ninputs = ["{text}"]\nout = "{tmp_path / "o"}"\n'
                      f'[options]\nto = "hdf5"\nmax-len = 4\n')
    res = run_cli("run", recipe, "--dry-run")
    assert res.exit_code == 2 and "--max-len applies to --to memmap only" in res.stderr, res.stderr
    res = run_cli("run", recipe, "--dry-run", "--set", "to=memmap")
    assert res.exit_code == 0 and "--max-len 4" in res.output, res.stderr


def test_the_writer_gets_its_options_and_the_manifest_records_them(tmp_path, text):
    out = tmp_path / "out"
    res = run_cli("convert", text, "-o", out, "--to", "webdataset", "--shard-samples", "2", "--wids-md5",
                  "--shard-bytes", "1MB", "-q")
    assert res.exit_code == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_options"] == {"shard_samples": 2, "shard_bytes": 1_000_000, "wids_md5": True}
    assert [s["samples"] for s in manifest["splits"]["train"]["shards"]] == [2, 2, 2]
    wids = json.loads((out / manifest["splits"]["train"]["wids"]).read_text())
    assert all("md5sum" in s for s in wids["shardlist"])


def test_option_values_are_typed_checked_and_picklable():
    declared = FormatOptions(to="x", options=(*SHARD_SIZE, Option(name="level", type="int", default=3, low=1, high=9),
                                              Option(name="fast", type="flag")))
    values = declared.values({"shard_bytes": "2KiB", "level": 9, "other": "ignored"})
    assert isinstance(values, OptionValues)
    assert (values.shard_samples, values.shard_bytes, values.level, values.fast) == (None, 2048, 9, False)
    assert pickle.loads(pickle.dumps(values)) == values
    assert values.as_dict() == {"shard_samples": None, "shard_bytes": 2048, "level": 9, "fast": False}
    with pytest.raises(AttributeError, match="declared: shard_samples, shard_bytes, level, fast"):
        values.other  # noqa: B018
    with pytest.raises(AttributeError):
        values.level = 1  # type: ignore[misc]
    for bad in ({"level": 10}, {"level": "3"}, {"shard_bytes": "lots"}, {"fast": "yes"}):
        with pytest.raises(UsageError):
            declared.values(bad)
    with pytest.raises(ValueError):
        Option(name="max-len")
    with pytest.raises(ValueError):
        FormatOptions(to="x", options=(SHARD_SIZE[0], SHARD_SIZE[0]))


def test_every_format_declares_its_options_where_the_registry_reads_them():
    declared = registry.format_options()
    for fmt in registry.formats():
        assert fmt.options is declared[fmt.name], f"{fmt.name}: its class and its options module disagree"
        assert fmt.options.to == fmt.option


def test_the_run_identity_is_a_function_of_the_option_values(tmp_path):
    def identity(**format_options: Any) -> str:
        opts = ConvertOptions(inputs=("x",), out=tmp_path, to="hdf5", format_options=format_options)
        return run_identity("convert", opts, [])["options"]

    assert identity(compression="gzip", shard_bytes=256_000_000) == identity(compression="gzip", shard_bytes=256_000_000)
    assert identity(compression="gzip") != identity(compression="lzf")


# -- a format written before formats declared options ----------------------------------------------

class LegacyTar(WebDatasetFormat):
    """As a plugin format was written before: no ``options``, the shard sizes read from ``job.opts``."""

    name = "legacy-tar"
    option = "legacy-tar"
    options = None

    def writer(self, job: Any, split: str, part: Any) -> Any:
        from shardsmith.formats.webdataset.writer import TarWriter

        o = job.opts
        return TarWriter(out_dir=job.out, split=split, shard_samples=o.shard_samples, shard_bytes=o.shard_bytes,
                         wids_md5=o.wids_md5, part=part)


@pytest.fixture()
def legacy(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = registry.Plugin("format", "legacy-tar", f"{__name__}:LegacyTar", origin="shardsmith-legacy")
    monkeypatch.setattr(registry, "_installed", lambda: (plugin,))


def test_a_format_declaring_no_options_gets_those_every_to_took_and_a_deprecation(legacy, tmp_path, text):
    found = sections(run_cli("convert", "--help").output)
    legacy_help = found["Options for --to legacy-tar"]
    assert all(f in legacy_help for f in ("--shard-samples", "--shard-bytes", "--wids-md5", "--compression",
                                          "--events-per-sample"))
    assert "--max-len" not in legacy_help
    out = tmp_path / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = run_cli("convert", text, "-o", out, "--to", "legacy-tar", "--shard-samples", "4", "--workers", "1", "-q")
    assert res.exit_code == 0, res.stderr
    said = {str(w.message) for w in caught if w.category is DeprecationWarning}
    assert ("job.opts.shard_samples is deprecated: a format declares its options (shardsmith.kit.options."
            "FormatOptions, as Format.options) and reads them as job.options.shard_samples") in said
    assert {m.partition(" ")[0] for m in said} == {"job.opts.shard_samples", "job.opts.shard_bytes", "job.opts.wids_md5"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["samples"] for s in manifest["splits"]["train"]["shards"]] == [4, 2]
    assert manifest["format_options"]["shard_samples"] == 4
    res = run_cli("convert", text, "-o", tmp_path / "o2", "--to", "legacy-tar", "--max-len", "4", "-q")
    assert one_line(res, 2) == "shardsmith: error: --max-len applies to --to memmap only, not to --to legacy-tar"


# -- the example plugin's format option ------------------------------------------------------------

CSV_PLUGIN = Path(__file__).resolve().parents[1] / "examples/plugins/shardsmith-csv"


@pytest.fixture()
def csv_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The example plugin's source and format, registered as its entry points would register them."""
    plugins = (registry.Plugin("source", "csv", "shardsmith_csv:CsvSource", origin="shardsmith-csv"),
               registry.Plugin("format", "csv", "shardsmith_csv:CsvFormat", origin="shardsmith-csv",
                               options="shardsmith_csv.options:OPTIONS"))
    monkeypatch.syspath_prepend(str(CSV_PLUGIN))
    monkeypatch.setattr(registry, "_installed", lambda: plugins)
    yield
    for name in [m for m in sys.modules if m == "shardsmith_csv" or m.startswith("shardsmith_csv.")]:
        sys.modules.pop(name)


def test_the_example_plugin_s_option_is_shown_refused_used_and_recorded(csv_plugin, tmp_path):
    found = sections(run_cli("convert", "--help").output)
    assert "--csv-delimiter [comma|tab]" in found["Options for --to csv"]
    assert "--shard-samples" in found["Options for --to csv"] and "--shard-bytes" not in found["Options for --to csv"]
    src = tmp_path / "in"
    src.mkdir()
    (src / "people.csv").write_text('id,text\n0,"one, two"\n1,three\n2,four\n', encoding="utf-8")
    res = run_cli("convert", src, "-o", tmp_path / "tar", "--to", "webdataset", "--csv-delimiter", "tab", "-q")
    assert one_line(res, 2) == "shardsmith: error: --csv-delimiter applies to --to csv only, not to --to webdataset"
    rows = {}
    for delimiter, suffix in (("comma", ".csv"), ("tab", ".tsv")):
        out = tmp_path / delimiter
        res = run_cli("convert", src, "-o", out, "--to", "csv", "--csv-delimiter", delimiter, "--shard-samples", "2",
                      "--seed", "1", "-q")
        assert res.exit_code == 0, res.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["format"] == "csv" and manifest["plugins"]["format csv"].startswith("shardsmith-csv")
        assert manifest["format_options"] == {"shard_samples": 2, "csv_delimiter": delimiter}
        shards = [s["path"] for s in manifest["splits"]["train"]["shards"]]
        assert shards == [f"train-000000{suffix}", f"train-000001{suffix}"]
        header = (out / shards[0]).read_text().splitlines()[0]
        assert header == {"comma": "__key__,id,text", "tab": "__key__\tid\ttext"}[delimiter]
        import shardsmith

        ds = shardsmith.open(out)
        rows[delimiter] = [ds[i] for i in range(len(ds))]
        assert run_cli("verify", out, "--deep").exit_code == 0
    assert rows["comma"] == rows["tab"] and sorted(r["text"] for r in rows["tab"]) == ["four", "one, two", "three"]


def test_an_option_named_as_the_command_s_own_or_declared_otherwise_is_left_out_with_a_warning(capsys):
    from shardsmith.cli_options import _format_params

    seed = FormatOptions(to="a", options=(Option(name="seed", type="int"), Option(name="level", type="int")))
    other = FormatOptions(to="b", options=(Option(name="level", type="str"),))
    params = _format_params((seed, other), frozenset({"seed", "out"}))
    assert [p.name for p in params] == ["level"] and params[0].type.name == "integer"
    assert capsys.readouterr().err.splitlines() == [
        "shardsmith: warning: --to a: --seed is an option of the command; it is left out",
        "shardsmith: warning: --to b: --level is declared otherwise by another format; it is left out"]
