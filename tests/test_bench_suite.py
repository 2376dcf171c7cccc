"""`make bench` (bench/suite.py): it knows every benchmark and what each needs, refuses an unknown name, and runs
one end to end."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import suite  # noqa: E402


def test_the_suite_lists_every_benchmark_file():
    files = {p.stem.removeprefix("bench_") for p in (ROOT / "bench").glob("bench_*.py")}
    assert files <= set(suite.BY_NAME), "add the new benchmark to bench/suite.py's SUITE"
    assert all(b.script.is_file() for b in suite.SUITE)
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")}
    left = scripts - {b.script.stem for b in suite.SUITE} - set(suite.NOT_RUN)
    assert not left, f"bench/suite.py: add {sorted(left)} to SUITE, or to NOT_RUN with the reason"
    assert set(suite.NOT_RUN) <= scripts, "bench/suite.py: NOT_RUN names a script that is gone"


def test_an_unknown_name_is_one_line_and_exit_2():
    res = subprocess.run([sys.executable, ROOT / "bench" / "suite.py", "--only", "mix,nope"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"bench: no benchmark named nope (known: {', '.join(suite.BY_NAME)})"]


def test_one_benchmark_runs_through_the_suite_into_its_folder(tmp_path):
    res = subprocess.run([sys.executable, ROOT / "bench" / "suite.py", "--only", "minhash_core", "--out", tmp_path],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    table = res.stdout.split("figures\n", 1)[1]
    assert table.startswith("minhash_core   ok"), res.stdout
    assert "\n      KEY   band_keys (normalize, 5-grams, sign, bands): " in table, res.stdout  # its headline figures
    log = (tmp_path / "minhash_core.log").read_text()
    assert log.startswith("$ ") and "bench_minhash_core.py" in log.splitlines()[0]
    assert [p.name for p in tmp_path.iterdir()] == ["minhash_core.log"]  # its temporary folder was in here, and is gone


def _imports(path: Path, *, top_level: bool) -> set[str]:
    """Modules ``path`` imports (its top level only, or anywhere), following bench/'s own modules
    at their top level (what importing them runs); stdlib and shardsmith left out."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body if top_level else ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        for name in names:
            top = name.split(".")[0]
            local = [d / f"{top}.py" for d in (ROOT / "bench", ROOT / "bench" / "anchors") if (d / f"{top}.py").is_file()]
            if local:
                found |= _imports(local[0], top_level=True)
            elif top not in sys.stdlib_module_names and top not in ("shardsmith", "__future__"):
                found.add("megatron.core" if top == "megatron" else top)
    return found


def test_every_module_a_benchmark_imports_is_a_need_an_anchor_or_a_core_dependency():
    # a benchmark that lacks a module is skipped with the command that installs it, not failed with a traceback
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    core = {re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].replace("-", "_") for d in deps}
    for b in suite.SUITE:
        undeclared = _imports(b.script, top_level=False) - core - set(b.needs) - set(b.anchors)
        assert not undeclared, f"bench/suite.py: add {sorted(undeclared)} to {b.name}'s needs (or anchors)"
        assert all(m in suite.INSTALL for m in (*b.needs, *b.anchors)), f"bench/suite.py: INSTALL lacks one of {b.name}'s"


def _options(path: Path) -> set[str]:
    """The option strings of every ``add_argument`` call in ``path``."""
    return {arg.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
            for arg in node.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("-")}


def test_each_quick_command_line_uses_options_its_benchmark_has():
    for b in suite.SUITE:
        given = {a for a in b.args if a.startswith("--")} | ({b.work} if b.work else set())
        assert given <= _options(b.script), f"{b.name}: {sorted(given - _options(b.script))} unknown to {b.script.name}"


def test_a_benchmark_without_its_modules_is_skipped_with_the_install_command():
    bench = suite.Bench("mix", (), needs=("numpy", "no_such_module_here"))
    assert suite.why_not(bench) == "needs no_such_module_here (pip install no_such_module_here)"
    assert suite.why_not(suite.Bench("mix", (), needs=("megatron_nowhere.core",))).startswith("needs megatron_nowhere.core")
    assert suite.install("torchvision") == "pip install torchvision==0.28.0"
    r = suite.run_one(bench, Path("unused"), timeout=1)
    assert r["status"] == "skipped" and r["log"] is None


def test_the_table_shows_verdicts_and_headline_figures():
    log = "noise\n  PASS  issue 2: >= 50 MB/s end to end: 61.0 MB/s\n  KEY   order build: 12.0x megatron's\n  x  PASS\n"
    assert suite.figures(log) == ["PASS  issue 2: >= 50 MB/s end to end: 61.0 MB/s", "KEY   order build: 12.0x megatron's"]
    assert suite.figures("  KEY   " + "x" * 200, width=20) == ["KEY   " + "x" * 11 + "..."]


def test_outputs_compare_without_what_names_their_run():
    from harness import comparable

    card = "# ds\n\n## Command\n\n```\nshardsmith pack-tokens IN -o {out}\n```\n\n## Splits\n\n{n} samples\n"
    assert comparable("README.md", card.format(out="a", n=3).encode()) == \
        comparable("README.md", card.format(out="s3://b/a", n=3).encode())
    assert comparable("README.md", card.format(out="a", n=3).encode()) != \
        comparable("README.md", card.format(out="a", n=4).encode())
    manifest = {"created": "t1", "command": ["-o", "a"], "run": {"id": "x"}, "splits": {"train": 3}}
    same = {**manifest, "created": "t2", "command": ["-o", "s3://b/a"], "run": {"id": "y"}}
    assert comparable("manifest.json", json.dumps(manifest).encode()) == comparable("manifest.json", json.dumps(same).encode())
    assert comparable("manifest.json", json.dumps(manifest).encode()) != \
        comparable("manifest.json", json.dumps({**manifest, "splits": {"train": 4}}).encode())
    assert comparable("train-000000.tar", b"bytes") == b"bytes"
