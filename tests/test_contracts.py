"""The plugin contracts of ``shardsmith.testing`` run for every built-in source and format, and for
the example plugin ``examples/plugins/shardsmith-csv`` (registered in this process, not installed):
the built-ins keep the promises a third-party plugin is held to."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import jpeg, jpeg_folder, make_docs, root_data, write_jsonl

from shardsmith import registry
from shardsmith.testing import FormatContract, SourceContract
from shardsmith.testing.runs import manifest, run, run_ok

CSV_PROJECT = Path(__file__).resolve().parents[1] / "examples/plugins/shardsmith-csv"
# the folder that holds the package shardsmith_csv: src/ (the layout asked for), else the project itself
CSV_PLUGIN = next((p for p in (CSV_PROJECT / "src", CSV_PROJECT) if (p / "shardsmith_csv/__init__.py").is_file()),
                  CSV_PROJECT / "src")


def two_jsonl_files(folder: Path, n: int = 100) -> None:
    docs = make_docs(n, seed=5, max_words=20)
    write_jsonl(folder / "a.jsonl", docs[: n * 3 // 5])
    write_jsonl(folder / "sub" / "b.jsonl", docs[n * 3 // 5:])


def rows_table(first: int, n: int, *, null_text_at: int | None = None) -> Any:
    import pyarrow as pa

    texts = [None if i == null_text_at else f"row {first + i}: " + d for i, d in enumerate(make_docs(n, seed=first))]
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()), "text": pa.array(texts, pa.string()),
                     "blob": pa.array([bytes([i % 256]) * (i % 7 + 1) for i in range(n)], pa.binary())})


def pulses(folder: Path, *, events: int = 60, seed: int = 1) -> list[Path]:
    """Two IceCube-like pulse tables (long format, grouped by event_id), no events table."""
    from shardsmith.demo.icecube_like import make_icecube_kaggle_like

    batches, meta = make_icecube_kaggle_like(folder, batches=2, events_per_batch=events, mean_pulses=6, seed=seed,
                                             row_group_rows=80)
    meta.unlink()
    return batches


def pulses_with_a_null(folder: Path, name: str, *, at: int) -> None:
    """A third pulse table of the same schema whose ``time`` is null in row ``at``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(folder / "batch_1.parquet")
    n = 20
    table = pa.table({"event_id": pa.array([10_000_000 + i // 4 for i in range(n)], pa.int64()),
                      "sensor_id": pa.array([i for i in range(n)], pa.int16()),
                      "time": pa.array([None if i == at else 1000 + i for i in range(n)], pa.int64()),
                      "charge": pa.array([0.5] * n, pa.float64()),
                      "auxiliary": pa.array([False] * n, pa.bool_())}).cast(schema)
    pq.write_table(table, folder / name)


# -- sources ----------------------------------------------------------------------------------------

class TestImageFolderSource(SourceContract):
    source = "imagefolder"
    convert_args = ["--to", "webdataset", "--shard-samples", "8"]
    crash_points = ("shard:train:1", "manifest")  # images are copied whole into shards: no scatter pass

    def make_inputs(self, folder: Path) -> None:
        jpeg_folder(folder, classes=2, per_class=20)

    def make_bad_input(self, folder: Path) -> tuple[str, int | None]:
        (folder / "c1" / "broken.jpg").write_bytes(jpeg(99)[:40])
        return "c1/broken.jpg", None


class TestJsonlSource(SourceContract):
    source = "jsonl"
    convert_args = ["--to", "webdataset", "--text-field", "text", "--shard-samples", "20", "--memory", "64KB"]

    def make_inputs(self, folder: Path) -> None:
        two_jsonl_files(folder)

    def make_bad_input(self, folder: Path) -> tuple[str, int | None]:
        lines = [json.dumps({"text": d}) for d in make_docs(8, seed=3)]
        lines.insert(3, '{"text": "unterminated')
        (folder / "c.jsonl").write_text("\n".join(lines) + "\n")
        return "c.jsonl", 4


class TestParquetRowsSource(SourceContract):
    source = "parquet"
    convert_args = ["--to", "webdataset", "--text-field", "text", "--shard-samples", "20"]

    def make_inputs(self, folder: Path) -> None:
        import pyarrow.parquet as pq

        pq.write_table(rows_table(0, 60), folder / "a.parquet", row_group_size=25)
        pq.write_table(rows_table(60, 45), folder / "b.parquet", row_group_size=25)

    def make_bad_input(self, folder: Path) -> tuple[str, int | None]:
        import pyarrow.parquet as pq

        pq.write_table(rows_table(200, 10, null_text_at=6), folder / "c.parquet")
        return "c.parquet", 7


class TestParquetEventsSource(SourceContract):
    source = "parquet-events"
    convert_args = ["--to", "hdf5", "--group-by", "event_id", "--shard-samples", "30"]

    def make_inputs(self, folder: Path) -> None:
        pulses(folder)

    def make_bad_input(self, folder: Path) -> tuple[str, int | None]:
        pulses_with_a_null(folder, "batch_9.parquet", at=6)
        return "batch_9.parquet", 7


class TestRootSource(SourceContract):
    source = "root"
    convert_args = ["--to", "hdf5", "--shard-samples", "40"]

    def make_inputs(self, folder: Path) -> None:
        small = root_data() / "uproot-small-flat-tree.root"  # 100 entries
        shutil.copyfile(small, folder / "a.root")
        shutil.copyfile(small, folder / "b.root")

    def make_bad_input(self, folder: Path) -> tuple[str, int | None]:
        """A copy whose first basket's key is overwritten: the file opens, its reading breaks off
        (ROOT files break as a whole or from a point on: no record is bad alone)."""
        import uproot

        small = root_data() / "uproot-small-flat-tree.root"
        with uproot.open(small) as f:
            seek = int(f["tree"].branches[0].member("fBasketSeek")[0])
        data = bytearray(small.read_bytes())
        data[seek:seek + 12] = b"\xff" * 12
        (folder / "c.root").write_bytes(bytes(data))
        return "c.root", None

    def test_a_truncated_file_beside_good_ones_is_skipped(self, contract_inputs: Path, tmp_path: Path) -> None:
        folder = tmp_path / "in"
        shutil.copytree(contract_inputs, folder)
        data = (root_data() / "uproot-small-flat-tree.root").read_bytes()
        (folder / "cut.root").write_bytes(data[: len(data) * 2 // 3])
        out = tmp_path / "out"
        run_ok(self.command_line(folder, out, extra=("--on-error", "skip")))
        assert [e["file"] for e in manifest(out)["source"]["unread"]] == ["cut.root"]


# -- formats ----------------------------------------------------------------------------------------

class TestWebDatasetFormat(FormatContract):
    format = "webdataset"
    convert_args = ["--text-field", "text", "--shard-samples", "20"]

    def make_inputs(self, folder: Path) -> None:
        two_jsonl_files(folder)


class TestParquetFormat(FormatContract):
    format = "parquet"
    convert_args = ["--text-field", "text", "--shard-samples", "20", "--row-group-rows", "7"]

    def make_inputs(self, folder: Path) -> None:
        two_jsonl_files(folder)


class TestLanceFormat(FormatContract):
    format = "lance"
    convert_args = ["--text-field", "text", "--shard-samples", "20"]

    def make_inputs(self, folder: Path) -> None:
        pytest.importorskip("lance", reason="--to lance needs pylance")
        two_jsonl_files(folder)


class TestHDF5Format(FormatContract):
    format = "hdf5"
    convert_args = ["--group-by", "event_id", "--shard-samples", "30", "--compression", "gzip"]

    def make_inputs(self, folder: Path) -> None:
        pulses(folder, seed=2)


class TestEventTarFormat(FormatContract):
    format = "event-tar"
    convert_args = ["--group-by", "event_id", "--shard-samples", "8", "--events-per-sample", "4"]

    def make_inputs(self, folder: Path) -> None:
        pulses(folder, seed=3)


class TestLanceEventsFormat(FormatContract):
    format = "lance-events"
    convert_args = ["--group-by", "event_id", "--shard-samples", "30"]

    def make_inputs(self, folder: Path) -> None:
        pytest.importorskip("lance", reason="--to lance needs pylance")
        pulses(folder, seed=5)


class TestMemmapFormat(FormatContract):
    format = "memmap"
    convert_args = ["--group-by", "event_id", "--max-len", "5", "--keep", "top:charge"]

    def make_inputs(self, folder: Path) -> None:
        pulses(folder, seed=4)

    def batch_items(self, batch: Any) -> list[Any]:
        """A batch is columns: ``values (B, L, F)``, ``lengths``, ``counts``, ``scalars``."""
        return [{"values": batch["values"][k], "length": int(batch["lengths"][k]), "count": int(batch["counts"][k]),
                 "scalars": {name: np.array(v[k]) for name, v in batch["scalars"].items()}}
                for k in range(len(batch["lengths"]))]

    def test_a_flipped_byte_fails_verify_naming_the_file(self, contract_output: Path, tmp_path: Path) -> None:
        """One array set per split (no second shard to flip): a byte of the values and of a scalar array."""
        for rel in ("train.values.bin", "train.event_id.bin"):
            out = tmp_path / rel
            shutil.copytree(contract_output, out)
            data = bytearray((out / rel).read_bytes())
            data[len(data) // 2] ^= 0x01
            (out / rel).write_bytes(bytes(data))
            res = run(["verify", str(out)])
            assert res.exit_code == 1 and f"FAIL {rel}" in res.output, res.output


class TestTokensFormat(FormatContract):
    format = "tokens"
    command = "pack-tokens"
    convert_args = ["--shard-tokens", "1500", "--memory", "64KB"]

    def make_inputs(self, folder: Path) -> None:
        from shardsmith.text.tokenize import train_bpe

        two_jsonl_files(folder / "docs")
        (folder / "tokenizer.json").write_text(train_bpe(make_docs(200, seed=99), vocab_size=300))

    def input_args(self, folder: Path) -> list[str]:
        return [str(folder / "docs"), "--tokenizer", str(folder / "tokenizer.json")]


# -- the example plugin -----------------------------------------------------------------------------

class _CsvPlugin:
    """The example plugin, registered as its entry point would register it, and its tables as inputs."""

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def csv_plugin(cls) -> Iterator[None]:
        with csv_plugin_registered():
            yield

    def make_inputs(self, folder: Path) -> None:
        csv_tables(folder)


@pytest.mark.skipif(not (CSV_PLUGIN / "shardsmith_csv" / "__init__.py").is_file(),
                    reason="the example plugin is not in this tree (examples/plugins/shardsmith-csv/src/shardsmith_csv)")
class TestCsvPluginSource(_CsvPlugin, SourceContract):
    """The example plugin, registered as its entry point would register it (its pip install is tested
    with the example): the registry sees it in this process, and the kill tests' children are forks."""

    source = "csv"
    convert_args = ["--to", "webdataset", "--shard-samples", "20"]

    def make_bad_input(self, folder: Path) -> tuple[str, int | None]:
        (folder / "c.csv").write_text("id,text\n1,one\n2,two\n3,three,and more\n4,four\n")
        return "c.csv", 3  # rows count from 1 after the header in messages


@pytest.mark.skipif(not (CSV_PLUGIN / "shardsmith_csv" / "format.py").is_file(),
                    reason="the example plugin's format is not in this tree")
class TestCsvPluginFormat(_CsvPlugin, FormatContract):
    """The example plugin's format (rows as CSV shards), with its own option."""

    format = "csv"
    convert_args = ["--shard-samples", "20", "--csv-delimiter", "tab"]


@pytest.mark.skipif(not (CSV_PLUGIN / "shardsmith_csv" / "pairs.py").is_file(),
                    reason="the example plugin's record kind is not in this tree")
class TestCsvPluginPairsSource(_CsvPlugin, SourceContract):
    """The example plugin's own record kind (key/value pairs), through its source of .properties files:
    convert takes the kind's steps, and the formats of rows write it (written_as)."""

    source = "properties"
    convert_args = ["--to", "webdataset", "--shard-samples", "20"]

    def make_inputs(self, folder: Path) -> None:
        properties_files(folder)

    def make_bad_input(self, folder: Path) -> tuple[str, int | None]:
        (folder / "c.properties").write_text("# a comment\none=1\ntwo 2\nthree: 3\n")
        return "c.properties", 3  # lines count from 1 in messages


@pytest.mark.skipif(not (CSV_PLUGIN / "shardsmith_csv" / "pairs.py").is_file(),
                    reason="the example plugin is not in this tree")
def test_the_example_plugin_s_sources_give_neutral_samples_that_its_format_reads(tmp_path):
    """Its sources give typed fields and no format's layout; its format gives no encoder, so it is
    handed the neutral sample (``kit/sample.py``), and webdataset's members come from webdataset."""
    from shardsmith.core.input_file import InputFile
    from shardsmith.kit.format import WriteJob
    from shardsmith.kit.reader import Task
    from shardsmith.kit.sample import NeutralEncoder, Sample

    (tmp_path / "a.csv").write_text("id,text\n1,one\n2,\"two, quoted\"\n")
    with csv_plugin_registered():
        csv_source = registry.get("source", "csv")()
        task = Task(index=0, file=InputFile(path=str(tmp_path / "a.csv"), rel="a.csv", index=0,
                                            size=(tmp_path / "a.csv").stat().st_size))
        rows = [csv_source.sample_fields(value) for _, value in csv_source.read(task)]
        pairs = registry.get("source", "properties")().sample_fields(("host", "example.org"))
        csv_format = registry.format_for(option="csv", holds="rows")
        assert type(csv_format.encoder(WriteJob(opts=None, out=tmp_path), "rows")) is NeutralEncoder
        from shardsmith_csv.format import _row

        row = _row(memoryview(Sample(key="k-r1", fields={**rows[1], "blob": b"\x00"}).encode()))
    assert rows == [{"id": "1", "text": "one"}, {"id": "2", "text": "two, quoted"}]
    assert pairs == {"key": "host", "value": "example.org"}
    assert row == {"__key__": "k-r1", "id": "2", "text": "two, quoted"}  # bytes are no CSV cell


def properties_files(folder: Path) -> None:
    """Two .properties files, 105 pairs: comments, blank lines, ``=`` and ``:``, values with spaces."""
    docs = make_docs(105, seed=9, max_words=6)
    for name, keys in (("a.properties", range(60)), ("sub/b.properties", range(60, 105))):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        lines = [f"# pairs {keys[0]}..{keys[-1]}", ""]
        lines += [f"key.{i % 17}{'=' if i % 3 else ': '}{' '.join(docs[i].split())}" for i in keys]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


@contextlib.contextmanager
def csv_plugin_registered() -> Iterator[None]:
    """The example plugin's sources, format and record kind, registered as their entry points would register them."""
    plugins = (registry.Plugin("source", "csv", "shardsmith_csv:CsvSource", origin="shardsmith-csv"),
               registry.Plugin("source", "properties", "shardsmith_csv:PropertiesSource", origin="shardsmith-csv"),
               registry.Plugin("format", "csv", "shardsmith_csv:CsvFormat", origin="shardsmith-csv",
                               options="shardsmith_csv.options:OPTIONS"),
               registry.Plugin("kind", "pairs", "shardsmith_csv:PairsKind", origin="shardsmith-csv"))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(CSV_PLUGIN))
        mp.setattr(registry, "_installed", lambda: plugins)
        yield
    for name in [m for m in sys.modules if m == "shardsmith_csv" or m.startswith("shardsmith_csv.")]:
        sys.modules.pop(name)
    registry._installed.cache_clear()


def csv_tables(folder: Path) -> None:
    import csv

    docs = make_docs(105, seed=8, max_words=8)  # commas, quotes and line breaks: csv quotes them
    for name, rows, sep in (("a.csv", range(60), ","), ("sub/b.tsv", range(60, 105), "\t")):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        with open(folder / name, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter=sep)
            writer.writerow(["id", "text"])
            writer.writerows([i, docs[i]] for i in rows)


# -- the contracts catch what they promise to catch ---------------------------------------------------

class _Shuffled:
    """A dataset whose iteration is not its random access: what the dataset contract must refuse."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Any:
        return self.ds[i]

    def iter(self, **options: Any) -> Iterator[Any]:
        return iter(reversed([self.ds[i] for i in range(len(self.ds))]))

    def get_batch(self, indices: Any) -> list[Any]:
        return [self.ds[int(i)] for i in indices][::-1]


def test_the_dataset_contract_refuses_a_dataset_that_disagrees_with_itself(tmp_path):
    class Broken(TestWebDatasetFormat):
        def open_dataset(self, out: Path) -> Any:
            return _Shuffled(super().open_dataset(out))

    (tmp_path / "in").mkdir()
    two_jsonl_files(tmp_path / "in")
    out = tmp_path / "out"
    contract = Broken()
    run_ok(contract.command_line(tmp_path / "in", out))
    with pytest.raises(AssertionError, match="differ"):
        contract.test_random_access_equals_iteration(out)
    with pytest.raises(AssertionError, match="get_batch"):
        contract.test_get_batch_equals_single_access(out)
    TestWebDatasetFormat().test_random_access_equals_iteration(out)  # the real one agrees


def test_a_crash_point_never_reached_fails_the_kill_test(tmp_path):
    from shardsmith.testing import run_killed

    (tmp_path / "in").mkdir()
    two_jsonl_files(tmp_path / "in")
    args = TestJsonlSource().command_line(tmp_path / "in", tmp_path / "out")
    with pytest.raises(AssertionError, match="never reached"):
        run_killed(args, "scatter:999")


def test_the_skip_report_names_the_row_where_a_file_broke_off(tmp_path):
    from conftest import run_cli

    pulses(tmp_path / "in")
    pulses_with_a_null(tmp_path / "in", "batch_9.parquet", at=6)
    res = run_cli("convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "hdf5", "--group-by", "event_id",
                  "--on-error", "skip", "-q")
    assert res.exit_code == 0, res.stderr
    assert "skipped batch_9.parquet row 7 on;" in res.stderr, res.stderr
    (entry,) = manifest(tmp_path / "out")["source"]["unread"]
    assert entry["record"] == 6 and entry["row"] == 7 and "the rest of this task is unread" in entry["reason"]
