"""``--transform tokenize=tokenizer.json``: each row's text as its token ids, a field MDS, Parquet and
Lance hold and their own readers give back (StreamingDataset, pyarrow and HF datasets, Lance's
``take``) equal to what ``tokenizers`` encodes, with the end-of-text id pack-tokens appends; the same
bytes for any ``--workers``; the tokenizer's content in the run's identity; errors in one line."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli, tree_digest
from test_mds_format import read_back

from shardsmith import open as open_dataset

DOCS = [{"id": i, "text": f"document {i} says " + "hello world, " * (i % 6) + "ünïcödé 日本" * (i % 2)}
        for i in range(30)]


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in DOCS))
    return path


def expected(tokenizer: Path, text: str, *, eos: str | None = "<|endoftext|>") -> list[int]:
    """The reference: ``tokenizers`` on the file, without the post-processor's specials (as
    pack-tokens encodes), then the end-of-text id."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    return tok.encode(text, add_special_tokens=False).ids + ([tok.token_to_id(eos)] if eos else [])


def convert(src: Path, out: Path, *args: Any) -> Path:
    res = run_cli("convert", src, "-o", out, "-q", "--shard-samples", "8", *args)
    assert res.exit_code == 0, res.stderr
    return out


def test_mds_token_ids_read_back_by_streaming(rows: Path, tmp_path: Path, bpe_tokenizer: Path) -> None:
    out = convert(rows, tmp_path / "mds", "--to", "mds", "--transform", f"tokenize={bpe_tokenizer}")
    got = read_back(out)
    assert len(got) == len(DOCS)
    for sample in got:
        ids = sample["input_ids"]
        assert isinstance(ids, np.ndarray) and ids.dtype == np.uint16 and ids.ndim == 1
        assert ids.tolist() == expected(bpe_tokenizer, sample["text"])
    ours = open_dataset(out, split="train")  # shardsmith's own reader of the dynamic-shape column
    assert [ours[i]["input_ids"].tolist() for i in range(len(ours))] == [s["input_ids"].tolist() for s in got]
    described = json.loads((out / "manifest.json").read_text())["transforms"][0]
    assert described["transform"] == "tokenize" and described["dtype"] == "uint16"
    assert described["engine"] == "gigatoken" and described["engine_reason"].startswith("matched tokenizers on")
    assert described["eos_token"] == "<|endoftext|>" and described["to"] == "input_ids"
    schema = json.loads((out / "manifest.json").read_text())["schema"]  # the new column named beside the source's
    assert schema["input_ids"] == {"kind": "tokens", "dtype": "uint16", "ragged": True} and "*" in schema


def test_parquet_column_of_lists_read_by_pyarrow(rows: Path, tmp_path: Path, bpe_tokenizer: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    out = convert(rows, tmp_path / "pq", "--to", "parquet", "--transform",
                  f"tokenize={bpe_tokenizer},to=tokens,eos=none")
    table = pq.read_table(sorted(out.glob("*.parquet")))
    assert table.schema.field("tokens").type == pa.list_(pa.uint16())
    assert json.loads((out / "manifest.json").read_text())["schema"]["tokens"]["kind"] == "tokens"
    for row in table.to_pylist():
        assert row["tokens"] == expected(bpe_tokenizer, row["text"], eos=None)


def test_lance_take_gives_the_ids_back(rows: Path, tmp_path: Path, bpe_tokenizer: Path) -> None:
    lance = pytest.importorskip("lance", reason="--to lance needs pylance")
    out = convert(rows, tmp_path / "lance", "--to", "lance", "--transform", f"tokenize={bpe_tokenizer}")
    ds = lance.dataset(str(out / "train.lance"))
    for row in ds.take([0, 7, 29]).to_pylist():
        assert row["input_ids"] == expected(bpe_tokenizer, row["text"])


def test_the_same_bytes_for_any_workers_and_engine(rows: Path, tmp_path: Path, bpe_tokenizer: Path) -> None:
    spec = f"tokenize={bpe_tokenizer}"
    one = convert(rows, tmp_path / "w1", "--to", "mds", "--transform", spec, "--workers", "1")
    two = convert(rows, tmp_path / "w2", "--to", "mds", "--transform", spec, "--workers", "2", "--memory", "1G")
    assert tree_digest(one) == tree_digest(two)
    hf = convert(rows, tmp_path / "hf", "--to", "mds", "--transform", f"{spec},engine=hf")
    assert json.loads((hf / "manifest.json").read_text())["transforms"][0]["engine"] == "hf"
    assert tree_digest(hf / "mds") == tree_digest(one / "mds")  # the shards: the engine changes no id


def test_an_edited_tokenizer_is_another_run(rows: Path, tmp_path: Path, bpe_tokenizer: Path) -> None:
    from shardsmith.text.tokenize import train_bpe

    tok = tmp_path / "tok.json"
    tok.write_bytes(bpe_tokenizer.read_bytes())
    out = convert(rows, tmp_path / "o", "--to", "parquet", "--transform", f"tokenize={tok}")
    tok.write_text(train_bpe(["other words entirely"] * 20, vocab_size=270))
    res = run_cli("convert", rows, "-o", out, "-q", "--shard-samples", "8", "--to", "parquet", "--transform",
                  f"tokenize={tok}")
    assert res.exit_code == 2 and "pass --overwrite" in res.stderr  # not taken for the finished run


def test_errors_are_one_line(rows: Path, tmp_path: Path, bpe_tokenizer: Path) -> None:
    not_json = tmp_path / "bad.json"
    not_json.write_text('{"x": 1}')
    for spec, words in ((f"tokenize={tmp_path / 'missing.json'}", "no such file"),
                        (f"tokenize={not_json}", "not a HuggingFace tokenizer.json"),
                        ("tokenize", "name the tokenizer file first"),
                        (f"tokenize={bpe_tokenizer},colour=red", "expected tokenize=FILE"),
                        (f"tokenize={bpe_tokenizer},engine=fast", "expected one of auto, hf, gigatoken"),
                        (f"tokenize={bpe_tokenizer},eos=<nope>", "is not in the tokenizer's vocabulary")):
        res = run_cli("convert", rows, "-o", tmp_path / "o", "--to", "mds", "--transform", spec)
        assert res.exit_code == 2, spec
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in res.stderr, lines


def test_a_row_without_the_text_is_a_bad_record(rows: Path, tmp_path: Path, bpe_tokenizer: Path) -> None:
    with open(rows, "a") as fh:
        fh.write('{"id": 99, "body": "no text here"}\n')
    args = ("convert", rows, "--to", "mds", "--transform", f"tokenize={bpe_tokenizer}")
    res = run_cli(*args, "-o", tmp_path / "a", "-q")
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [
        "shardsmith: error: docs.jsonl: line 31: no 'text' field to tokenize (fields: id, body); name the text "
        "with tokenize=FILE,field=NAME (pass --on-error skip to skip bad records)"]
    res = run_cli(*args, "-o", tmp_path / "b", "-q", "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["source"]["skipped"]["count"] == 1


def test_the_transform_pickles_without_its_encoder(bpe_tokenizer: Path) -> None:
    from shardsmith import registry

    cls = registry.get("transform", "tokenize")
    made = cls.from_spec(f"{bpe_tokenizer},field=body,bos=<|endoftext|>", opts=None)
    first = made.apply({"body": "hello world"}, identity="a#0", copy=0)["input_ids"]
    again = pickle.loads(pickle.dumps(made))
    assert again._encoder is None
    assert again.apply({"body": "hello world"}, identity="a#0", copy=0)["input_ids"].tolist() == first.tolist()
    eos = first[-1]
    assert first.tolist() == [eos, *expected(bpe_tokenizer, "hello world")]  # bos, the ids, eos
    assert made.inputs()[0] == str(bpe_tokenizer)


def test_a_tokenizer_gigatoken_cannot_take_runs_on_the_reference(rows: Path, tmp_path: Path,
                                                                  wordpiece_tokenizer: Path) -> None:
    """A WordPiece file that truncates and pads (as sentence-transformers ship them): the ids are the
    whole text's, without padding, then [SEP]; the engine is tokenizers, and the manifest says why."""
    pq = pytest.importorskip("pyarrow.parquet")
    from tokenizers import Tokenizer

    out = convert(rows, tmp_path / "wp", "--to", "parquet", "--transform", f"tokenize={wordpiece_tokenizer}")
    described = json.loads((out / "manifest.json").read_text())["transforms"][0]
    assert described["engine"] == "hf" and described["eos_token"] == "[SEP]", described
    tok = Tokenizer.from_file(str(wordpiece_tokenizer))
    tok.no_truncation()
    tok.no_padding()
    for row in pq.read_table(sorted(out.glob("*.parquet"))).to_pylist():
        assert row["input_ids"] == tok.encode(row["text"], add_special_tokens=False).ids + [tok.token_to_id("[SEP]")]


def test_cluster_stages_make_the_same_bytes(rows: Path, tmp_path: Path, bpe_tokenizer: Path) -> None:
    args = ["convert", rows, "--to", "mds", "--shard-samples", "6", "--transform", f"tokenize={bpe_tokenizer}", "-q"]
    assert run_cli(*args, "-o", tmp_path / "one").exit_code == 0
    for stage, rank in (("scatter", 0), ("scatter", 1), ("plan", 0), ("gather", 1), ("gather", 0), ("finalize", 0)):
        res = run_cli(*args, "-o", tmp_path / "two", "--stage", stage, "--rank", str(rank), "--world-size", "2")
        assert res.exit_code == 0, (stage, rank, res.stderr)
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")
    described = [json.loads((tmp_path / name / "manifest.json").read_text())["transforms"] for name in ("one", "two")]
    assert described[0] == described[1] and described[0][0]["engine"] == "gigatoken"  # one decision, the first rank's
