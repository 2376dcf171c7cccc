"""``shardsmith run RECIPE``: a recipe runs exactly the command line it stands for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli, tree_digest

from shardsmith.commands.run_recipe import argv, load

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_recipes_parse_into_valid_command_lines(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the recipe's inputs are (a dry run checks that they exist)
    for name in load(path)["inputs"]:
        (tmp_path / name).mkdir(parents=True)
    res = run_cli("run", path, "--dry-run")
    assert res.exit_code == 0, res.stderr
    line = res.output.strip()
    assert line.startswith("shardsmith convert ") or line.startswith("shardsmith pack-tokens ")
    from shardsmith.cli import main

    # click parses the options the recipe names (a typo in a shipped recipe fails here)
    args = argv(load(path))
    ctx = main.make_context("shardsmith", list(args), resilient_parsing=True)
    sub = main.get_command(ctx, args[0])
    sub.make_context(args[0], list(args[1:]))


def test_a_recipe_gives_the_bytes_of_its_command_line(corpus, bpe_tokenizer, tmp_path):
    root, _ = corpus
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"""
command = "pack-tokens"
inputs = ["{root}"]
out = "{tmp_path / 'via-recipe'}"
[options]
tokenizer = "{bpe_tokenizer}"
split = {{ train = 0.8, val = 0.2 }}
seed = 5
nanogpt = true
no-shuffle = false
quiet = true
""")
    res = run_cli("run", recipe)
    assert res.exit_code == 0, res.stderr
    direct = run_cli("pack-tokens", root, "-o", tmp_path / "direct", "--tokenizer", bpe_tokenizer,
                     "--split", "train=0.8,val=0.2", "--seed", "5", "--nanogpt", "-q")
    assert direct.exit_code == 0
    assert tree_digest(tmp_path / "via-recipe") == tree_digest(tmp_path / "direct")
    m = json.loads((tmp_path / "via-recipe" / "manifest.json").read_text())
    assert m["seed"] == 5 and set(m["splits"]) == {"train", "val"}
    res = run_cli("run", recipe, "--set", "seed=6", "--dry-run")
    assert "--seed 6" in res.output


@pytest.mark.parametrize("text, message", [
    ('command = "frobnicate"\ninputs = ["a"]\nout = "o"', "'command' must be"),
    ('command = "convert"\nout = "o"', "'inputs'"),
    ('command = "convert"\ninputs = ["a"]\nout = "o"\nto = "hdf5"', "unknown keys"),
    ('command = "convert" inputs', "not a readable TOML"),
])
def test_bad_recipes_are_usage_errors(tmp_path, text, message):
    recipe = tmp_path / "bad.toml"
    recipe.write_text(text)
    res = run_cli("run", recipe)
    assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = run_cli("run", tmp_path / "missing.toml")
    assert res.exit_code == 2 and "no such recipe" in res.stderr


def test_a_dry_run_names_the_inputs_that_are_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.jsonl").write_text('{"text": "a"}\n')
    recipe = tmp_path / "r.toml"
    recipe.write_text('command = "pack-tokens"\ninputs = ["here.jsonl", "gone/", "parts/*.jsonl", "s3://b/x/"]\n'
                      'out = "o"\n[options]\ntrain-tokenizer = 300\n')
    res = run_cli("run", recipe, "--dry-run")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert "no such input: gone/, parts/*.jsonl (paths are relative to the working directory" in res.stderr
    (tmp_path / "gone").mkdir()
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.jsonl").write_text('{"text": "b"}\n')
    res = run_cli("run", recipe, "--dry-run")  # a URL is listed by the run itself, not by a dry run
    assert res.exit_code == 0, res.stderr


def test_the_tiny_recipe_runs_out_of_the_box_and_twice(tmp_path):
    """make data RECIPE=recipes/tiny-tokens.toml, as a user runs it from the clone's folder: the second run finds
    the dataset complete (exit 0), and leaves its files as they were."""
    import subprocess
    import sys

    (tmp_path / "examples").symlink_to(RECIPES.parent / "examples")
    (tmp_path / "recipes").symlink_to(RECIPES)
    runs = [subprocess.run([sys.executable, "-m", "shardsmith", "run", "recipes/tiny-tokens.toml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    out = tmp_path / "build" / "tiny-tokens"
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    assert "already complete" in runs[1].stderr and "already complete" not in runs[0].stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["splits"]["train"]["samples"] + m["splits"]["val"]["samples"] == 589, m["splits"]
    assert (out / "train.bin").is_file() and (out / "val.bin").is_file()
