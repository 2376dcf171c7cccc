"""Bad input: one line naming the file and line, a non-zero exit, no traceback, no complete-looking output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_docs, run_cli, run_subprocess, tree_digest, write_jsonl


def bad_corpus(tmp_path: Path, bad_line: bytes, *, at: int = 3) -> Path:
    docs = make_docs(10)
    lines = [json.dumps({"text": d}).encode() for d in docs]
    lines.insert(at, bad_line)
    root = tmp_path / "in"
    root.mkdir()
    (root / "data.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return root


CASES = {
    "malformed JSON": (b'{"text": "unterminated', "malformed JSON"),
    "invalid UTF-8": (b'{"text": "caf\xe9"}', "invalid UTF-8"),
    "missing field": (b'{"body": "no text here"}', "no 'text' field"),
    "null text": (b'{"text": null}', "'text' is null"),
    "not an object": (b'["text"]', "expected a JSON object"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_record_fails_with_file_and_line(tmp_path, bpe_tokenizer, case):
    line, reason = CASES[case]
    root = bad_corpus(tmp_path, line)
    out = tmp_path / "out"
    res = run_subprocess("pack-tokens", root, "-o", out, "--tokenizer", bpe_tokenizer, "--quiet", "--workers", "2")
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0, res.stderr  # one line
    assert "Traceback" not in res.stderr
    assert "data.jsonl: line 4:" in res.stderr and reason in res.stderr
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("*.bin"))  # no shard that looks whole


@pytest.mark.parametrize("case", list(CASES))
def test_skip_counts_and_lists_bad_records(tmp_path, bpe_tokenizer, case):
    line, reason = CASES[case]
    root = bad_corpus(tmp_path, line, at=5)
    res = run_cli("pack-tokens", root, "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "--quiet",
                  "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    src = m["source"]
    assert src["records"] == 11
    assert src["skipped"]["count"] == 1
    (entry,) = src["skipped"]["records"]
    assert entry["file"] == "data.jsonl" and entry["line"] == 6 and reason in entry["reason"]
    assert src["records"] == m["splits"]["train"]["samples"] + src["skipped"]["count"]


def test_blank_lines_are_not_records_but_keep_line_numbers(tmp_path, bpe_tokenizer):
    root = tmp_path / "in"
    root.mkdir()
    (root / "d.jsonl").write_text('{"text": "a"}\n\n   \n{"text": "b"}\n{"oops": 1}\n')
    res = run_cli("pack-tokens", root, "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "--quiet")
    assert res.exit_code == 1 and "d.jsonl: line 5:" in res.stderr


def test_truncated_gzip_is_a_clear_error(tmp_path, bpe_tokenizer):
    import gzip

    root = tmp_path / "in"
    root.mkdir()
    data = gzip.compress(b"".join(json.dumps({"text": d}).encode() + b"\n" for d in make_docs(2000)))
    (root / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    res = run_cli("pack-tokens", root, "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "--quiet")
    assert res.exit_code == 1 and "t.jsonl.gz" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("pack-tokens", root, "-o", tmp_path / "skip", "--tokenizer", bpe_tokenizer, "--quiet",
                  "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    m = json.loads((tmp_path / "skip" / "manifest.json").read_text())
    assert m["source"]["skipped"]["count"] == 0
    (entry,) = m["source"]["unread"]
    assert entry["record"] is None and "the rest of the file is unread" in entry["reason"]
    assert m["source"]["records"] == m["splits"]["train"]["samples"] > 0


def test_truncated_zstd_is_a_clear_error_not_a_short_file(tmp_path, bpe_tokenizer):
    import zstandard

    root = tmp_path / "in"
    root.mkdir()
    data = zstandard.ZstdCompressor().compress(
        b"".join(json.dumps({"text": d}).encode() + b"\n" for d in make_docs(3000)))
    (root / "t.jsonl.zst").write_bytes(data[: len(data) // 2])
    res = run_cli("pack-tokens", root, "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "--quiet")
    assert res.exit_code == 1 and "t.jsonl.zst" in res.stderr and "truncated" in res.stderr, res.stderr
    res = run_cli("pack-tokens", root, "-o", tmp_path / "skip", "--tokenizer", bpe_tokenizer, "--quiet",
                  "--on-error", "skip")
    m = json.loads((tmp_path / "skip" / "manifest.json").read_text())
    assert "truncated" in m["source"]["unread"][0]["reason"]


def test_a_failed_run_does_not_block_the_rerun(tmp_path, bpe_tokenizer):
    root = bad_corpus(tmp_path, b"{oops")
    assert run_cli("pack-tokens", root, "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "-q").exit_code == 1
    assert not (tmp_path / "out").exists()  # the failed run created it, and removed it again
    (tmp_path / "out").mkdir()  # a folder that was there before the failed run is kept, with its leftovers
    assert run_cli("pack-tokens", root, "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "-q").exit_code == 1
    assert (tmp_path / "out" / "tokenizer.json").exists() and (tmp_path / "out").is_dir()
    res = run_cli("pack-tokens", root, "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "-q",
                  "--on-error", "skip")
    assert res.exit_code == 0, res.stderr


def test_missing_or_broken_tokenizer(tmp_path, corpus):
    root, _ = corpus
    res = run_cli("pack-tokens", root, "-o", tmp_path / "o1", "--tokenizer", tmp_path / "nope.json")
    assert res.exit_code == 2 and "nope.json: no such file" in res.stderr
    (tmp_path / "bad.json").write_text("{not json")
    res = run_cli("pack-tokens", root, "-o", tmp_path / "o2", "--tokenizer", tmp_path / "bad.json")
    assert res.exit_code == 2 and "bad.json: not a HuggingFace tokenizer.json" in res.stderr


def test_tokenizer_without_eos_needs_an_option(tmp_path, corpus):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "t.json"))
    root, _ = corpus
    res = run_cli("pack-tokens", root, "-o", tmp_path / "o", "--tokenizer", tmp_path / "t.json")
    assert res.exit_code == 2 and "--eos-token" in res.stderr
    res = run_cli("pack-tokens", root, "-o", tmp_path / "o2", "--tokenizer", tmp_path / "t.json", "--eos-token", "</s>")
    assert res.exit_code == 2 and "'</s>' is not in the tokenizer's vocabulary" in res.stderr
    res = run_cli("pack-tokens", root, "-o", tmp_path / "o3", "--tokenizer", tmp_path / "t.json", "--no-eos", "-q")
    assert res.exit_code == 0


@pytest.mark.parametrize("args, message", [
    (["--memory", "0"], "--memory: must be positive"),
    (["--memory", "lots"], "cannot read 'lots' as a size"),
    (["--shard-tokens", "0"], "--shard-tokens: must be positive"),
    (["--split", "train=0.9,val=0.2"], "fractions sum to 1.1"),
    (["--split", "train"], "expected name=fraction"),
    (["--workers", "0"], "--workers"),
])
def test_bad_options_are_usage_errors(tmp_path, corpus, bpe_tokenizer, args, message):
    root, _ = corpus
    res = run_cli("pack-tokens", root, "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, *args)
    assert res.exit_code == 2 and message in res.stderr, res.stderr


def test_missing_input_and_empty_folder(tmp_path, bpe_tokenizer):
    res = run_cli("pack-tokens", tmp_path / "missing.jsonl", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer)
    assert res.exit_code == 2 and "missing.jsonl: no such file or folder" in res.stderr
    (tmp_path / "empty").mkdir()
    res = run_cli("pack-tokens", tmp_path / "empty", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer)
    assert res.exit_code == 2 and "no input files" in res.stderr
    write_jsonl(tmp_path / "x" / "a.jsonl", [])
    res = run_cli("pack-tokens", tmp_path / "x", "-o", tmp_path / "o3", "--tokenizer", bpe_tokenizer, "-q")
    assert res.exit_code == 1 and "nothing to write" in res.stderr


def test_missing_parquet_column(tmp_path, bpe_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "in" / "p.parquet")
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "-q")
    assert res.exit_code == 1 and "p.parquet: no 'text' column; its columns: body (name the text with --text-field)" in res.stderr


def test_a_killed_worker_ends_the_run_with_a_message(tmp_path, bpe_tokenizer, monkeypatch):
    import os
    import signal

    import shardsmith.engine.shuffle.scatter as pipeline

    for i in range(4):
        write_jsonl(tmp_path / "in" / f"{i}.jsonl", make_docs(20, seed=i))
    real = pipeline.scatter_task

    def dying(job, task, **kw):
        if task.index == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
        return real(job, task, **kw)

    monkeypatch.setattr(pipeline, "scatter_task", dying)
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "-q",
                  "--workers", "2")
    assert res.exit_code == 1 and "a worker process died" in res.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()
    monkeypatch.setattr(pipeline, "scatter_task", real)  # the same command again: it resumes
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "-q",
                  "--workers", "2")
    assert res.exit_code == 0, res.stderr
    one = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "one", "--tokenizer", bpe_tokenizer, "-q")
    assert one.exit_code == 0 and tree_digest(tmp_path / "out") == tree_digest(tmp_path / "one")


@pytest.mark.parametrize("command", ["pack-tokens", "convert"])
def test_a_file_name_that_is_not_utf8_is_one_line(tmp_path, bpe_tokenizer, command):
    """A name with stray bytes (Python holds them as surrogates) would name records and manifest
    entries: refused with its bytes shown, never a TypeError from the JSON encoder."""
    root = tmp_path / "in"
    write_jsonl(root / "ok.jsonl", make_docs(5))
    (root / os.fsdecode(b"bad\xff.jsonl")).write_bytes((root / "ok.jsonl").read_bytes())
    extra = ["--tokenizer", str(bpe_tokenizer)] if command == "pack-tokens" else ["--to", "webdataset"]
    res = run_subprocess(command, str(root), "-o", str(tmp_path / "out"), "-q", *extra)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"shardsmith: error: {root}/bad\\xff.jsonl: the file's name is not valid UTF-8; rename it (records, keys "
        f"and the manifest name inputs by their paths, in UTF-8)"]
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("where", ["input", "output"])
def test_an_argument_that_is_not_utf8_is_one_line(tmp_path, bpe_tokenizer, where):
    odd = tmp_path / os.fsdecode(b"caf\xe9")
    root = tmp_path / "in"
    write_jsonl(root / "ok.jsonl", make_docs(5))
    src, out = (odd, tmp_path / "out") if where == "input" else (root, odd)
    res = run_subprocess("pack-tokens", str(src), "-o", str(out), "--tokenizer", str(bpe_tokenizer), "-q")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines() == [f"shardsmith: error: {tmp_path}/caf\\xe9: not valid UTF-8; rename the "
                                               f"file or folder (paths are recorded in the manifest, in UTF-8)"]


def test_a_folder_above_the_inputs_may_have_any_name(tmp_path, bpe_tokenizer):
    """Only names below the input root name records: the folder the inputs sit in may be anything."""
    odd = tmp_path / os.fsdecode(b"caf\xe9")
    write_jsonl(odd / "in" / "ok.jsonl", make_docs(5))
    (odd / "tok.json").write_bytes(bpe_tokenizer.read_bytes())  # named relative: its absolute path is odd too
    res = subprocess.run([sys.executable, "-m", "shardsmith", "pack-tokens", "in", "-o", "out", "--tokenizer",
                          "tok.json", "-q"], cwd=odd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads((odd / "out" / "manifest.json").read_bytes())["source"]["inputs"] == ["ok.jsonl"]


def test_a_row_nested_past_what_json_writes_back_is_a_bad_record(tmp_path):
    """orjson reads 1,024 levels of nesting and writes 254: a row between the two was a TypeError
    traceback when convert wrote its json member."""
    root = bad_corpus(tmp_path, b'{"text": "x", "meta": ' + b"[" * 300 + b"]" * 300 + b"}")
    res = run_cli("convert", root, "-o", tmp_path / "out", "--to", "webdataset", "-q")
    assert res.exit_code == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().count("\n") == 0 and "data.jsonl: line 4:" in res.stderr and "254 levels" in res.stderr
    res = run_cli("convert", root, "-o", tmp_path / "skipped", "--to", "webdataset", "-q", "--on-error", "skip")
    assert res.exit_code == 0 and "1 skipped" in res.output, res.output
