"""Every option is range-checked: a value past its range is a usage error (exit 2, one line), never
a traceback; a recipe's --dry-run checks its options as the real run would."""

from __future__ import annotations

import pytest
from conftest import run_cli, write_jsonl

HUGE = str(2**70)


@pytest.fixture()
def text(tmp_path):
    return write_jsonl(tmp_path / "in" / "a.jsonl", ["one document", "another one"])


@pytest.mark.parametrize("args", [
    ["--seed", HUGE], ["--seed", "-1"], ["--memory", "99999999TB"], ["--workers", "100000"],
    ["--limit", HUGE], ["--limit", "0"], ["--rank", HUGE], ["--world-size", HUGE], ["--seq-len", HUGE],
    ["--shard-tokens", "99999999TB"], ["--train-tokenizer", HUGE], ["--split", "train=nan"],
], ids=lambda a: " ".join(a)[:30])
def test_pack_tokens_options_out_of_range(tmp_path, text, bpe_tokenizer, args):
    extra = [] if "--train-tokenizer" in args else ["--tokenizer", bpe_tokenizer]
    res = run_cli("pack-tokens", text, "-o", tmp_path / "o", *extra, "-q", *args)
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert "Traceback" not in res.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ["--seed", HUGE], ["--memory", "99999999TB"], ["--shard-bytes", "99999999TB"], ["--shard-samples", HUGE],
    ["--copies", HUGE], ["--quality", "0"], ["--events-per-sample", HUGE], ["--step-size", "99999999TB"],
], ids=lambda a: " ".join(a)[:30])
def test_convert_options_out_of_range(tmp_path, text, args):
    res = run_cli("convert", text, "-o", tmp_path / "o", "--to", "webdataset", "-q", *args)
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert "Traceback" not in res.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ["--batch-size", HUGE], ["--seconds", "1e9"], ["--target-tokens-per-s", "inf"], ["--seq-len", HUGE],
])
def test_bench_options_out_of_range(tmp_path, args):
    res = run_cli("bench", tmp_path, *args)
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr


def test_recipe_dry_run_checks_options_and_set_out_replaces_the_output(tmp_path, text, bpe_tokenizer):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'command = "pack-tokens"\ninputs = ["{text}"]\nout = "{tmp_path / "o"}"\n'
                      f'[options]\ntokenizer = "{bpe_tokenizer}"\nmemory = "99999999TB"\n')
    res = run_cli("run", recipe, "--dry-run")
    assert res.exit_code == 2 and "--memory" in res.stderr, res.stderr
    res = run_cli("run", recipe, "--dry-run", "--set", "memory=1GB", "--set", f"out={tmp_path / 'elsewhere'}")
    assert res.exit_code == 0, res.stderr
    line = res.output.strip()
    assert line.count(" -o ") == 1 and "--out" not in line and str(tmp_path / "elsewhere") in line, line
    assert "--memory 1GB" in line and "99999999TB" not in line
    res = run_cli("run", recipe, "--dry-run", "--set", "memory=1GB", "--set", f"seed={HUGE}")
    assert res.exit_code == 2 and "--seed" in res.stderr, res.stderr


def test_the_summary_names_skipped_records_and_counts_in_words(tmp_path, text):
    with open(text, "a") as fh:
        fh.write("{not json\n")
    res = run_cli("convert", text, "-o", tmp_path / "o", "--to", "webdataset", "-q", "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    assert "2 samples in 1 shard;" in res.output and "3 records read, 1 skipped" in res.output, res.output
    assert "skipped a.jsonl line 3" in res.stderr and "manifest.json" in res.stderr, res.stderr
