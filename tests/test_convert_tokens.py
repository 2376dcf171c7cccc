"""``convert --to tokens`` is ``pack-tokens``' job: the same inputs and options through both commands
write the same files, manifests included (all but the time and the command line as typed); the tokens
format reads its own options (``job.options``) and its manifests record them where they always did."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, tree_digest

from shardsmith import registry
from shardsmith.kit.format import WriteJob
from shardsmith.kit.writer import ShardRange


def manifest_of(out: Path) -> dict[str, Any]:
    """The manifest without what records when and as which command line it was made."""
    m = json.loads((out / "manifest.json").read_text())
    m.pop("created")
    m.pop("command")
    return m


def card_of(out: Path) -> list[str]:
    """The dataset card without the lines that quote the command line."""
    return [line for line in (out / "README.md").read_text().splitlines() if "shardsmith " not in line]


@pytest.mark.parametrize("extra", [
    ["--shard-tokens", "3000", "--seed", "3"],
    ["--pack", "best-fit", "--seq-len", "64", "--seed", "1"],
    ["--nanogpt", "--split", "train=0.9,val=0.1", "--seq-len", "32"],
], ids=["plain", "packed", "nanogpt"])
def test_convert_to_tokens_writes_what_pack_tokens_writes(corpus, bpe_tokenizer, tmp_path, extra):
    root, _ = corpus
    out = tmp_path / "out"  # one output path for both: the run's identity names it
    made = {}
    for command in (["pack-tokens"], ["convert", "--to", "tokens"]):
        res = run_cli(*command, root, "--tokenizer", bpe_tokenizer, *extra, "--workers", "1", "-q", "-o", out)
        assert res.exit_code == 0, res.stderr
        made[command[0]] = shutil.move(out, tmp_path / command[0])
    pack, convert = (Path(made[c]) for c in ("pack-tokens", "convert"))
    assert tree_digest(pack) == tree_digest(convert)
    assert manifest_of(pack) == manifest_of(convert)  # the run identity too: one job
    assert card_of(pack) == card_of(convert)
    assert "format_options" not in manifest_of(pack)  # the values stay where they were (seq_len, packing)


def test_convert_to_tokens_says_what_pack_tokens_says(corpus, bpe_tokenizer, tmp_path):
    root, _ = corpus
    lines = [run_cli(*command, root, "--tokenizer", bpe_tokenizer, "--workers", "1", "-q", "-o", tmp_path / name)
             .output.replace(str(tmp_path / name), "OUT") for name, command in (("a", ["pack-tokens"]),
                                                                              ("b", ["convert", "--to", "tokens"]))]
    assert lines[0] == lines[1] and "documents" in lines[0] and "engine" in lines[0]


def one_line(res: Any, code: int) -> str:
    assert res.exit_code == code, (res.exit_code, res.output, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_convert_to_tokens_refuses_in_one_line(corpus, bpe_tokenizer, tmp_path):
    root, _ = corpus
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    (images / "a.jpg").write_bytes(b"\xff\xd8\xff\xd9")
    out = tmp_path / "out"
    cases = [
        ([root, "--to", "tokens"], "--tokenizer FILE and --train-tokenizer"),
        ([tmp_path / "images", "--to", "tokens", "--tokenizer", bpe_tokenizer], "no input files"),
        ([root, "--to", "tokens", "--tokenizer", bpe_tokenizer, "--augment", "hflip"],
         "--augment does not apply to --to tokens"),
        ([root, "--to", "parquet", "--tokenizer", bpe_tokenizer], "--tokenizer applies to --to tokens only"),
        ([root, "--to", "webdataset", "--seq-len", "8"], "--seq-len applies to --to tokens only"),
    ]
    for args, says in cases:
        assert says in one_line(run_cli("convert", *args, "-q", "-o", out), 2)
        assert not (out / "manifest.json").exists()


def test_convert_help_lists_the_tokens_options_and_one_provenance():
    res = run_cli("convert", "--help")
    assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr
    section = res.output.split("Options for --to tokens:")[1].split("Options for --to webdataset")[0]
    for flag in ("--tokenizer", "--train-tokenizer", "--seq-len", "--pack", "--shard-tokens", "--nanogpt"):
        assert flag in section
    assert res.output.count("--provenance") == 1


def test_the_tokens_writer_reads_its_own_options_only(tmp_path):
    """``job.opts`` is nothing the writer could read: every value comes from ``job.options``."""
    import numpy as np

    fmt = registry.format_named("tokens")
    values = fmt.options.values({"shard_tokens": 100, "pack": "best-fit", "seq_len": 8, "pad_id": 0,
                                 "pack_window": 64})
    job = WriteJob(opts=None, out=tmp_path, options=values, schema=np.dtype(np.uint16))
    writer = fmt.writer(job, "train", ShardRange())
    assert type(writer).__name__ == "PackedTokensWriter"
    assert fmt.manifest_fields(job, {})["packing"]["window_tokens"] == 64


def test_convert_s_job_of_tokens_is_pack_tokens_job(tmp_path, bpe_tokenizer):
    """Through the Python API too: the format's options typed as it declares them (a size as text)."""
    from shardsmith.commands import convert, pack_tokens

    opts = convert.ConvertOptions(inputs=("in",), out=tmp_path / "o", to="tokens", seed=4,
                                  format_options={"tokenizer": str(bpe_tokenizer), "shard_tokens": "2KB",
                                                  "provenance": True})
    expected = pack_tokens.PackTokensOptions(inputs=("in",), out=tmp_path / "o", tokenizer=str(bpe_tokenizer),
                                             shard_tokens=2000, seed=4, provenance=True)
    assert convert.job_of(opts) == pack_tokens.job_of(expected)
    with pytest.raises(Exception, match="--max-len does not apply to --to tokens"):
        convert.job_of(convert.ConvertOptions(inputs=("in",), out=tmp_path / "o", to="tokens",
                                              format_options={"max_len": 4}))
