"""Transforms through the registry: ``--transform NAME[=SPEC]`` on convert and pack-tokens, the
built-in ``select``, ``--augment`` as the registered ``augment``, and recipes with transforms."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from conftest import make_docs, run_cli, tree_digest, write_jsonl


def _rows(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    write_jsonl(folder / "a.jsonl", make_docs(60, seed=1))
    write_jsonl(folder / "b.jsonl", make_docs(40, seed=2))
    return folder


def _members(shard: Path) -> list[dict]:
    with tarfile.open(shard) as tar:
        return [json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")]


def test_select_keeps_the_named_fields_for_any_workers(tmp_path):
    folder = _rows(tmp_path)
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        res = run_cli("convert", folder, "--to", "webdataset", "--transform", "select=text", "--workers", workers,
                      "-o", out, "-q")
        assert res.exit_code == 0, res.stderr
        outs.append(out)
    assert tree_digest(outs[0]) == tree_digest(outs[1])
    rows = _members(outs[0] / "train-000000.tar")
    assert len(rows) == 100 and all(list(r) == ["text"] for r in rows)
    manifest = json.loads((outs[0] / "manifest.json").read_text())
    assert manifest["transforms"] == [{"transform": "select", "fields": ["text"]}]


def test_a_row_the_transform_refuses_is_a_bad_record(tmp_path):
    folder = _rows(tmp_path)
    with open(folder / "a.jsonl", "a") as fh:
        fh.write('{"id": 99}\n')
    res = run_cli("convert", folder, "--to", "webdataset", "--transform", "select=id,text", "-o", tmp_path / "o", "-q")
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [
        "shardsmith: error: a.jsonl: line 61: no field 'text' to select (fields: id) "
        "(pass --on-error skip to skip bad records)"]
    res = run_cli("convert", folder, "--to", "webdataset", "--transform", "select=id,text", "--on-error", "skip",
                  "-o", tmp_path / "o", "-q")
    assert res.exit_code == 0
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["source"]["skipped"]["count"] == 1


def test_pack_tokens_takes_the_text_after_the_transforms(tmp_path, bpe_tokenizer):
    folder = _rows(tmp_path)
    plain, selected = tmp_path / "plain", tmp_path / "selected"
    assert run_cli("pack-tokens", folder, "--tokenizer", bpe_tokenizer, "-o", plain, "-q").exit_code == 0
    res = run_cli("pack-tokens", folder, "--tokenizer", bpe_tokenizer, "--transform", "select=text", "-o", selected,
                  "-q", "--workers", "2")
    assert res.exit_code == 0, res.stderr
    assert tree_digest(plain) == tree_digest(selected)  # the text is the same, so are the tokens
    res = run_cli("pack-tokens", folder, "--tokenizer", bpe_tokenizer, "--transform", "select=title", "-o",
                  tmp_path / "x", "-q", "--on-error", "skip")
    assert res.exit_code == 1 and "nothing to write" in res.stderr


def test_transform_errors_are_one_line(tmp_path):
    folder = _rows(tmp_path)
    for args, message in ((("--transform", "nope"), "no transform named 'nope'"),
                          (("--transform", "select"), "needs at least one field name"),
                          (("--transform", "augment=hflip"), "it applies to images, and these inputs hold rows")):
        res = run_cli("convert", folder, "--to", "webdataset", *args, "-o", tmp_path / "o", "-q")
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and message in res.stderr, res.stderr


def test_a_recipe_lists_transforms(tmp_path):
    from shardsmith.commands.run_recipe import argv

    recipe = {"command": "convert", "inputs": ["in"], "out": "o",
              "options": {"to": "webdataset", "transform": ["select=id,text", "select=text"]}}
    assert argv(recipe) == ["convert", "in", "-o", "o", "--to", "webdataset", "--transform", "select=id,text",
                            "--transform", "select=text"]
