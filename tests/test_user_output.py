"""Output a user reads (issue 42, item 16): an install without setuptools' deprecation banner, counts in
the right number, a refusal that names the options that changed, the same job named by relative or
absolute paths, an input named twice, quoted globs, and what a first `make demo` costs; each as a
user meets it, through the program."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import run_cli, tree_digest, write_jsonl

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The program as a shell runs it, in a process of its own (its warnings shown as lines)."""
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def _files(out: Path) -> dict[str, bytes]:
    """Every file of a folder, by name."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_the_build_configuration_gives_setuptools_nothing_to_warn_about():
    """`pip install -e .` printed setuptools' `project.license` deprecation banner on every install: the
    license is an SPDX string, which setuptools reads from 77 on (the build-system's lower bound)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration, read_configuration
    from setuptools.dist import Distribution

    pyproject = ROOT / "pyproject.toml"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the banner is a warning setuptools emits while it reads the table
        apply_configuration(Distribution(), str(pyproject))
    build = read_configuration(str(pyproject))["build-system"]["requires"]
    floor = [s for r in map(Requirement, build) if r.name == "setuptools" for s in r.specifier if s.operator == ">="]
    assert floor and Version(floor[0].version) >= Version("77"), build


def test_every_count_a_user_reads_agrees_with_its_number(tmp_path):
    one = write_jsonl(tmp_path / "in" / "a.jsonl", ["just one document here"])
    res = run_cli("pack-tokens", one.parent, "-o", tmp_path / "t", "--train-tokenizer", "300")
    assert res.exit_code == 0, res.stderr
    assert "train: 1 document, " in res.output and " in 1 shard; 1 record read" in res.output, res.output
    assert "gather: 1 sample, " in res.stderr, res.stderr  # a progress line
    shown = run_cli("inspect", tmp_path / "t").output
    assert "jsonl reader, 1 input file, 1 record, 0 skipped" in shown, shown
    assert re.search(r"split train: 1 sample, \d+ tokens in 1 shard,", shown), shown
    res = run_cli("convert", one.parent, "-o", tmp_path / "w", "--to", "webdataset", "--text-field", "text", "-q")
    assert res.exit_code == 0 and "train: 1 sample in 1 shard; 1 record read" in res.output, res.output
    assert re.search(r": OK: \d+ files, 1 sample, ", run_cli("verify", tmp_path / "w").output)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine\n")
    res = run_cli("convert", one.parent, "-o", tmp_path / "mine", "--to", "webdataset", "--text-field", "text")
    assert res.exit_code == 2 and "folder is not empty (1 entry)" in res.stderr, res.stderr


def test_the_counting_words():
    from shardsmith.core.words import plural

    assert [plural(n, "shard") for n in (0, 1, 2, 12345)] == ["0 shards", "1 shard", "2 shards", "12,345 shards"]
    assert (plural(1, "entry"), plural(3, "entry"), plural(2, "class"), plural(2, "day")) == (
        "1 entry", "3 entries", "2 classes", "2 days")
    assert plural(2, "input file") == "2 input files" and plural(2, "person", "people") == "2 people"


def test_a_changed_option_on_a_finished_dataset_is_named(tmp_path):
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [f"document {i} with some words" for i in range(20)]).parent
    out = tmp_path / "out"
    made = ["convert", src, "-o", out, "--to", "webdataset", "--text-field", "text", "-q"]
    assert run_cli(*made, "--shard-samples", "8").exit_code == 0
    before = _files(out)
    res = run_cli(*made, "--shard-samples=5", "--workers", "1", "--split", "train=0.5,val=0.5")
    assert res.exit_code == 2, res.stderr
    assert res.stderr.strip() == (f"shardsmith: error: -o {out}: holds a finished dataset made with other options: "
                                  "--shard-samples 8 (now 5); no --split (now train=0.5,val=0.5); pass --overwrite "
                                  "to replace it"), res.stderr  # (--workers never changes a dataset: not named)
    assert _files(out) == before
    other = write_jsonl(tmp_path / "other" / "b.jsonl", ["another document"]).parent
    res = run_cli("convert", other, "-o", out, "--to", "webdataset", "--text-field", "text", "--shard-samples", "8")
    assert res.exit_code == 2 and f"made with other options: inputs {src} (now {other});" in res.stderr, res.stderr


def test_the_same_job_named_by_relative_or_absolute_paths_is_the_same_run(tmp_path, monkeypatch, bpe_tokenizer):
    write_jsonl(tmp_path / "in" / "a.jsonl", [f"document {i} with some words" for i in range(20)])
    (tmp_path / "tok.json").write_bytes(bpe_tokenizer.read_bytes())
    absolute = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", tmp_path / "tok.json",
                       "--seq-len", "8")
    assert absolute.exit_code == 0, absolute.stderr
    before = _files(tmp_path / "out")
    for cwd, args in ((tmp_path, ["in", "-o", "out", "--tokenizer", "tok.json"]),
                      (tmp_path / "in", ["../in/", "-o", "./../out", "--tokenizer", "../tok.json"])):
        monkeypatch.chdir(cwd)
        res = run_cli("pack-tokens", *args, "--seq-len", "8")
        assert res.exit_code == 0, res.stderr
        assert "already complete (this same command finished it; nothing to do)" in res.stderr, res.stderr
    assert _files(tmp_path / "out") == before
    recorded = json.loads((tmp_path / "out" / "manifest.json").read_text())["command"]
    assert recorded[2] == str(tmp_path / "in")  # the command stays as it was typed


def test_a_killed_run_resumes_when_its_paths_are_spelled_another_way(tmp_path):
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [f"document {i} with some words" for i in range(20)]).parent
    common = ["--to", "webdataset", "--text-field", "text", "--workers", "1"]
    killed = subprocess.run([sys.executable, "-m", "shardsmith", "convert", str(src), "-o", str(tmp_path / "out"),
                             *common], env={**os.environ, "SHARDSMITH_CRASH_AT": "manifest"}, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr  # every shard written, no manifest
    rerun = _cli("convert", "./in", "-o", "out/", *common, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert re.search(r"^resumed: .* scatter tasks? reused from a killed run", rerun.stderr, re.M), rerun.stderr


def test_an_input_named_twice_is_read_once_and_said(tmp_path):
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [f"document {i}" for i in range(6)])
    write_jsonl(tmp_path / "in" / "b.jsonl", [f"other {i}" for i in range(4)])
    os.symlink(tmp_path / "in", tmp_path / "alias")
    common = ["--to", "webdataset", "--text-field", "text", "-q"]
    assert run_cli("convert", src.parent, "-o", tmp_path / "once", *common).exit_code == 0
    twice = _cli("convert", "in", "in/a.jsonl", "./in/", "alias", src, "-o", "twice", *common, cwd=tmp_path)
    assert twice.returncode == 0, twice.stderr
    assert twice.stderr.splitlines() == [
        "shardsmith: warning: inputs named more than once are read once: in/a.jsonl: 1 file also named by in; "
        f"./in/: 2 files also named by in; alias: 2 files also named by in; {src}: 1 file also named by in"], \
        twice.stderr
    assert "10 records read" in twice.stdout, twice.stdout
    assert tree_digest(tmp_path / "twice") == tree_digest(tmp_path / "once")  # as if each were named once
    res = run_cli("convert", src, src, "-o", tmp_path / "same", *common)
    assert res.exit_code == 0 and res.stderr == (f"shardsmith: warning: inputs named more than once are read once: "
                                                 f"{src}: 1 file named twice\n"), res.stderr


def test_a_quoted_local_glob_names_its_files(tmp_path, monkeypatch):
    for name in ("b", "a", "c"):
        write_jsonl(tmp_path / "in" / f"{name}.jsonl", [f"{name} document {i}" for i in range(3)])
    write_jsonl(tmp_path / "in" / "deeper" / "d.jsonl", ["a deeper document"])
    monkeypatch.chdir(tmp_path)
    common = ["--to", "webdataset", "--text-field", "text", "-q"]
    assert run_cli("convert", "in/a.jsonl", "in/b.jsonl", "in/c.jsonl", "-o", "named", *common).exit_code == 0
    globbed = run_cli("convert", "in/*.jsonl", "-o", "globbed", *common)  # as a quoted glob reaches the program
    assert globbed.exit_code == 0, globbed.stderr
    manifest = json.loads((tmp_path / "globbed" / "manifest.json").read_text())
    assert manifest["source"]["inputs"] == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert tree_digest(tmp_path / "globbed") == tree_digest(tmp_path / "named")
    deep = run_cli("convert", "in/**/*.jsonl", "-o", "deep", *common)
    assert deep.exit_code == 0 and "10 records read" in deep.output, deep.stderr
    res = run_cli("convert", "in/*.parquet", "-o", "none", *common)
    assert res.exit_code == 2 and res.stderr == "shardsmith: error: in/*.parquet: no file matches\n", res.stderr
    assert not (tmp_path / "none").exists()


def test_a_deep_glob_enters_no_linked_folder(tmp_path, monkeypatch):
    """``**`` as bash's globstar: a link to a folder above is not entered (Python's glob follows it,
    naming every file 40 times over; with two such links it never ends)."""
    write_jsonl(tmp_path / "in" / "a.jsonl", ["a document"])
    write_jsonl(tmp_path / "in" / "deeper" / "b.jsonl", ["a deeper document"])
    (tmp_path / "in" / "deeper" / "up").symlink_to("..")
    monkeypatch.chdir(tmp_path)
    res = run_cli("convert", "in/**/*.jsonl", "-o", "deep", "--to", "webdataset", "--text-field", "text")
    assert res.exit_code == 0 and "2 records read" in res.output, res.output
    assert "named" not in res.stderr, res.stderr
    manifest = json.loads((tmp_path / "deep" / "manifest.json").read_text())
    assert manifest["source"]["inputs"] == ["a.jsonl", "deeper/b.jsonl"]


def test_the_readme_says_what_a_first_make_demo_costs():
    """`make demo` "(~10 s)" was the demo only: a first run also creates the virtual environment and
    installs shardsmith and its dependencies into it."""
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("make demo ") and "#" in ln]
    assert len(lines) >= 2, lines  # the install and the two-command blocks
    for line in lines:
        said = line.split("#", 1)[1]
        assert "first run" in said and "install" in said and "minute" in said, line
