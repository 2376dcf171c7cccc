"""The plugin protocol as a user meets it: real packages, pip-installed into a fresh venv.

One venv per module (``venv``): ``python -m venv`` in a temporary folder, then one real ``pip
install`` (dependencies and all, from pip's cache and the configured indexes: about 20 s here) of
shardsmith, of the example plugin ``examples/plugins/shardsmith-csv`` and of a broken plugin this
module writes (its module raises ImportError). Both projects are copied to the temporary folder
first, so pip's in-tree build leaves no ``build/`` or ``*.egg-info`` in the repository (a stale
``build/lib`` would also put deleted modules into the wheel). Every command then runs as that
venv's ``shardsmith`` executable, and reading back runs in that venv's python: nothing from this
checkout or its venv is importable there.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_docs, tree_digest

pytestmark = pytest.mark.walkthrough  # make test-walkthroughs (a user's path, end to end: slow)

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples/plugins/shardsmith-csv"
BROKEN_WARNING = ("shardsmith: warning: source 'broken' from shardsmith-broken: cannot load "
                  "shardsmith_broken:BrokenSource (ImportError: this plugin is broken on purpose); it is left out")

BROKEN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "shardsmith-broken"
version = "0.1.0"
dependencies = ["shardsmith"]

[project.entry-points."shardsmith.sources"]
broken = "shardsmith_broken:BrokenSource"

[tool.setuptools]
packages = ["shardsmith_broken"]
"""


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.bin = path / "bin"

    def run(self, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``shardsmith ARGS`` as that venv's executable, in a clean environment."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run([str(self.bin / "shardsmith"), *map(str, args)], capture_output=True, text=True,
                              env=env, cwd=cwd, timeout=300)

    def python(self, script: str, *args: str | Path) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        res = subprocess.run([str(self.bin / "python"), "-c", script, *map(str, args)], capture_output=True,
                             text=True, env=env, cwd=self.path, timeout=300)
        assert res.returncode == 0, res.stderr
        return res.stdout


def _copy_project(src: Path, dest: Path, names: list[str]) -> Path:
    dest.mkdir(parents=True)
    for name in names:
        if (src / name).is_dir():
            shutil.copytree(src / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            shutil.copy2(src / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    base = tmp_path_factory.mktemp("plugin-venv")
    started = time.monotonic()
    made = subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"python -m venv cannot run here: {made.stderr.strip()[-300:]}")
    env = Venv(base / "venv")
    pip = [str(env.bin / "python"), "-m", "pip"]
    if subprocess.run([*pip, "--version"], capture_output=True).returncode != 0:
        pytest.skip("pip cannot run in a fresh venv here (python -m venv made one without pip)")
    project = _copy_project(ROOT, base / "src/shardsmith", ["pyproject.toml", "README.md", "shardsmith"])
    plugin = _copy_project(PLUGIN, base / "src/shardsmith-csv", ["pyproject.toml", "README.md", "shardsmith_csv"])
    broken = base / "src/shardsmith-broken"
    (broken / "shardsmith_broken").mkdir(parents=True)
    (broken / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (broken / "shardsmith_broken/__init__.py").write_text('raise ImportError("this plugin is broken on purpose")\n')
    res = subprocess.run([*pip, "install", "--quiet", "--no-input", str(project), str(plugin), str(broken)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    print(f"\nplugin venv built in {time.monotonic() - started:.1f} s")
    return env


def write_table(path: Path, rows: list[dict[str, str]], *, delimiter: str = ",") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict[str, str]]]]:
    """A CSV big enough to be cut into several tasks (its documents hold commas, quotes and line
    breaks, so cuts must fall between records), and a small TSV; rows by file in input order."""
    root = tmp_path_factory.mktemp("tables")
    docs = make_docs(1900, seed=3, max_words=60)
    big = [{"id": str(i), "text": d + (' "quoted", and\na second line' if i % 7 == 0 else "")}
           for i, d in enumerate(docs[:1800])]
    small = [{"id": str(i), "lang": "x", "text": d} for i, d in enumerate(docs[1800:])]
    write_table(root / "a.csv", big)
    write_table(root / "sub/b.tsv", small, delimiter="\t")
    assert (root / "a.csv").stat().st_size > 3 * (64 << 10)  # several tasks at --memory 512KB
    return root, {"a.csv": big, "sub/b.tsv": small}


PLAN = """\
import sys
from shardsmith.engine.inputs.files import discover
from shardsmith.engine.shuffle.run import Sizing
from shardsmith_csv import CsvSource
files = discover(sys.argv[1:], suffixes=CsvSource.suffixes)
sizing = Sizing.of(memory=512 << 10, workers=2, input_bytes=sum(f.size for f in files))
print(len(CsvSource().plan(files, chunk_bytes=sizing.chunk_bytes)))
"""

READ_BACK = """\
import json, sys
import shardsmith
ds = shardsmith.open(sys.argv[1])
out = []
for i in range(len(ds)):
    s = ds[i]
    j = s["json"]
    out.append({"key": s["__key__"], "json": j if isinstance(j, dict) else json.loads(j),
                "txt": s["txt"] if isinstance(s["txt"], str) else bytes(s["txt"]).decode()})
print(json.dumps(out))
"""


DOCUMENTS = """\
import json, sys
from tokenizers import Tokenizer
from shardsmith.loader import TokenDocuments
docs, tok = TokenDocuments(sys.argv[1]), Tokenizer.from_file(sys.argv[2])
eos = tok.token_to_id("<|endoftext|>")
print(json.dumps([tok.decode([int(t) for t in docs[i] if t != eos]) for i in range(len(docs))]))
"""


def test_plugins_lists_the_package_and_the_broken_one(venv):
    res = venv.run("plugins")
    assert res.returncode == 0, res.stderr
    rows = {line.split()[1]: line for line in res.stdout.splitlines() if line.startswith("source")}
    assert rows["csv"].split()[2:] == ["shardsmith_csv:CsvSource", "shardsmith-csv", "ok"]
    assert "shardsmith-broken" in rows["broken"] and "cannot load" in rows["broken"]
    assert "ImportError: this plugin is broken on purpose" in rows["broken"]
    assert rows["jsonl"].split()[3:] == ["shardsmith", "ok"]


def test_convert_csv_and_tsv_reads_back(venv, tables, tmp_path):
    root, rows = tables
    tasks = venv.python(PLAN, root / "a.csv")
    assert int(tasks) >= 3  # the big file is shared between workers
    outs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        res = venv.run("convert", root, "--to", "webdataset", "--text-field", "text", "-o", out,
                       "--workers", workers, "--memory", "512KB", "--quiet")
        assert res.returncode == 0, res.stderr
        assert res.stderr.splitlines() == [BROKEN_WARNING]  # once, and nothing else
        outs[workers] = out
    manifest = json.loads((outs["2"] / "manifest.json").read_text())
    assert manifest["source"]["reader"] == "csv" and manifest["schema"]["json"] == {"kind": "json"}
    assert tree_digest(outs["1"]) == tree_digest(outs["2"])  # the same bytes for any worker count
    samples = json.loads(venv.python(READ_BACK, outs["2"]))
    assert len(samples) == sum(len(r) for r in rows.values())
    got = sorted((s["json"]["id"], s["json"].get("lang", ""), s["json"]["text"], s["txt"]) for s in samples)
    want = sorted((r["id"], r.get("lang", ""), r["text"], r["text"]) for file_rows in rows.values() for r in file_rows)
    assert got == want
    assert list(samples[0]["json"]) in (["id", "text"], ["id", "lang", "text"])  # header order


def test_pack_tokens_reads_the_text_column(venv, tables, bpe_tokenizer, tmp_path):
    root, rows = tables
    res = venv.run("pack-tokens", root, "--tokenizer", bpe_tokenizer, "-o", tmp_path / "tok", "--workers", "2",
                   "--memory", "512KB", "--quiet")
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [BROKEN_WARNING]
    texts = json.loads(venv.python(DOCUMENTS, tmp_path / "tok", bpe_tokenizer))
    assert sorted(texts) == sorted(r["text"] for file_rows in rows.values() for r in file_rows)


def test_bad_row_fails_naming_file_and_row_or_is_skipped(venv, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "people.csv").write_text('id,text\n0,fine\n1,"two\nlines"\n2,too,many\n3,last\n', encoding="utf-8")
    res = venv.run("convert", src, "--to", "webdataset", "-o", tmp_path / "out", "--quiet")
    errors = [line for line in res.stderr.splitlines() if line != BROKEN_WARNING]
    assert res.returncode == 1, res.stderr
    assert len(errors) == 1 and "people.csv: row 3: 3 fields, the header has 2" in errors[0], res.stderr
    res = venv.run("convert", src, "--to", "webdataset", "-o", tmp_path / "out", "--quiet", "--on-error", "skip")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    skipped = manifest["source"]["skipped"]
    assert [(r["file"], r["row"]) for r in skipped["records"]] == [("people.csv", 3)]
    assert manifest["splits"]["train"]["samples"] == 3


def test_jsonl_still_converts_beside_a_broken_plugin(venv, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)))
    res = venv.run("convert", src, "--to", "webdataset", "--text-field", "text", "-o", tmp_path / "out", "--quiet")
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [BROKEN_WARNING]
    assert json.loads((tmp_path / "out/manifest.json").read_text())["source"]["reader"] == "jsonl"


def test_a_plugin_transform_runs_on_the_plugin_source(venv, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "t.csv").write_text('id,text\n0,"  Cafe\u0301   au\n lait "\n1,plain\n', encoding="utf-8")
    res = venv.run("plugins")
    assert "transform  normalize" in res.stdout and "shardsmith-csv" in res.stdout
    res = venv.run("convert", src, "--to", "webdataset", "--transform", "normalize=text", "--text-field", "text",
                   "-o", tmp_path / "out", "--quiet")
    assert res.returncode == 0, res.stderr
    samples = json.loads(venv.python(READ_BACK, tmp_path / "out"))
    assert sorted(s["txt"] for s in samples) == ["Caf\u00e9 au lait", "plain"]
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["transforms"] == [{"transform": "normalize", "field": "text"}]
    assert manifest["plugins"] == {"source csv": "shardsmith-csv 0.1.0", "transform normalize": "shardsmith-csv 0.1.0"}


def test_the_plugin_format_s_own_option(venv, tmp_path):
    """The example's format declares --csv-delimiter in a light module (its own entry point group):
    shown by convert --help, refused with another --to, used by its writer, recorded in the manifest."""
    res = venv.run("convert", "--help")
    assert res.returncode == 0, res.stderr
    section = res.stdout.partition("Options for --to csv:")[2].partition("\n\n")[0]
    assert "--csv-delimiter [comma|tab]" in section and "--shard-samples" in section, res.stdout
    src = tmp_path / "in"
    src.mkdir()
    (src / "t.csv").write_text('id,text\n0,"a, b"\n1,c\n2,d\n', encoding="utf-8")
    res = venv.run("convert", src, "--to", "webdataset", "--csv-delimiter", "tab", "-o", tmp_path / "tar", "--quiet")
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[-1] == "shardsmith: error: --csv-delimiter applies to --to csv only, not to --to webdataset"
    res = venv.run("convert", src, "--to", "csv", "--csv-delimiter", "tab", "-o", tmp_path / "out", "--quiet")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["format_options"] == {"shard_samples": None, "csv_delimiter": "tab"}
    assert manifest["plugins"]["format csv"] == "shardsmith-csv 0.1.0"
    (shard,) = [s["path"] for s in manifest["splits"]["train"]["shards"]]
    assert shard == "train-000000.tsv" and (tmp_path / "out" / shard).read_text().startswith("__key__\tid\ttext\n")
    assert venv.run("verify", tmp_path / "out", "--deep").returncode == 0


READ_PAIRS = """\
import json, sys
import shardsmith
ds = shardsmith.open(sys.argv[1])
pairs = [ds[i]["json"] for i in range(len(ds))]
print(json.dumps([[p["key"], p["value"]] for p in (j if isinstance(j, dict) else json.loads(j) for j in pairs)]))
"""


def test_the_plugin_s_own_record_kind_converts_through_its_entry_point(venv, tmp_path):
    """The example's kind ``pairs`` (entry point group shardsmith.kinds), held by its .properties source:
    listed, converted into a built-in format of rows, and named in the manifest's plugins."""
    res = venv.run("plugins")
    assert res.returncode == 0, res.stderr
    kinds = {line.split()[1]: line.split()[2:] for line in res.stdout.splitlines() if line.startswith("kind")}
    assert kinds["pairs"] == ["shardsmith_csv:PairsKind", "shardsmith-csv", "ok"], res.stdout
    assert kinds["rows"][-2:] == ["shardsmith", "ok"]
    src = tmp_path / "in"
    src.mkdir()
    (src / "app.properties").write_text("# settings\nhost=example.org\nport: 8080\n", encoding="utf-8")
    res = venv.run("convert", src, "--to", "webdataset", "-o", tmp_path / "out", "--quiet")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["plugins"]["source properties"] == manifest["plugins"]["kind pairs"] == "shardsmith-csv 0.1.0"
    pairs = json.loads(venv.python(READ_PAIRS, tmp_path / "out"))
    assert sorted(map(tuple, pairs)) == [("host", "example.org"), ("port", "8080")]


def test_a_core_install_names_the_extra_a_root_file_needs(venv, tmp_path):
    """Given a ROOT file without the root extra, the hint names it, worded as every hint is (install_hint)."""
    pytest.importorskip("uproot")
    from shardsmith.demo.root_files import make_icecube_like
    from shardsmith.errors import install_hint

    root = make_icecube_like(tmp_path / "in" / "run.root", events=20, mean_pulses=3, seed=0)
    res = venv.run("convert", root.parent, "-o", tmp_path / "out", "--to", "hdf5")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "run.root: the root source reads it, and needs uproot" in res.stderr, res.stderr
    assert install_hint("root") in res.stderr and "not a supported input" not in res.stderr
    res = venv.run("convert", root, "-o", tmp_path / "out", "--to", "hdf5")
    assert res.returncode == 2 and install_hint("root") in res.stderr, res.stderr
