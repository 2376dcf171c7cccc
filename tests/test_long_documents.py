"""Bombs in text input: a line of many megabytes is tokenized in pieces, in bounded memory, to the
ids of the whole document; a line past the record limit is a bad record; a tokenizer whose ids
change when a document is cut refuses long documents instead of changing them."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
from conftest import WORDS, run_cli, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from shardsmith.commands.engine_check import check_engine
from shardsmith.text import tokenize as tk

# many processes a test (DataLoader workers, killed ranks, an S3 server, a browser) or long: `make test-heavy`
pytestmark = pytest.mark.heavy

ALPHABET = st.sampled_from([*WORDS, " ", " ", "  ", "\n", "\t", ",", ".", "'s", "123", "日本", "🙂", "\r\n"])


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(ALPHABET, min_size=1, max_size=120), size=st.integers(min_value=8, max_value=60))
def test_pieces_give_the_whole_documents_ids(bpe_tokenizer, wordpiece_tokenizer, parts, size):
    text = "".join(parts)
    cut = tk.pieces(text, size)
    if cut is None:
        return
    assert "".join(cut) == text and all(len(p) <= size for p in cut)
    for path in (bpe_tokenizer, wordpiece_tokenizer):
        tok = Tokenizer.from_file(str(path))
        tok.no_truncation()
        tok.no_padding()
        whole = tok.encode(text, add_special_tokens=False).ids
        assert [i for p in cut for i in tok.encode(p, add_special_tokens=False).ids] == whole


def _long_text(chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words, n = [], 0
    while n < chars:
        w = rng.choice(WORDS) + rng.choice([" ", " ", " ", ", ", ".\n", "  "])
        words.append(w)
        n += len(w)
    return "".join(words)


def _peak_rss_mb(args: list[str]) -> tuple[int, float]:
    """Run the program; (exit code, its peak resident memory in MB)."""
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:]).returncode\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(r)\n")
    res = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "shardsmith", *args],
                         capture_output=True, text=True, timeout=300)
    return res.returncode, int(res.stdout.strip().splitlines()[-1]) / 1024


def test_a_line_of_megabytes_is_encoded_in_pieces_to_the_whole_documents_ids(bpe_tokenizer, tmp_path):
    long = _long_text(6_000_000)
    src = write_jsonl(tmp_path / "in" / "a.jsonl", ["short one", long, "another short one"])
    out = tmp_path / "out"
    code, rss = _peak_rss_mb(["pack-tokens", str(src), "-o", str(out), "--tokenizer", str(bpe_tokenizer),
                              "--no-shuffle", "--workers", "1", "-q"])
    assert code == 0
    assert rss < 600, f"peak RSS {rss:.0f} MB"  # encoding 6 MB whole takes gigabytes
    tok = Tokenizer.from_file(str(bpe_tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    want = [i for t in ("short one", long, "another short one")
            for i in [*tok.encode(t, add_special_tokens=False).ids, eos]]
    m = json.loads((out / "manifest.json").read_text())
    got = np.fromfile(out / "train-000000.bin", dtype=m["tokenizer"]["dtype"])
    assert got.tolist() == want


def test_a_line_over_the_record_limit_is_a_bad_record(bpe_tokenizer, tmp_path):
    docs = ["first", _long_text(3_000_000), "third"]  # --memory 16MB, 1 worker: records up to 2 MB
    src = write_jsonl(tmp_path / "in" / "a.jsonl", docs)
    res = run_cli("pack-tokens", src, "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "--memory", "16MB",
                  "--workers", "1", "-q")
    assert res.exit_code == 1 and "a.jsonl: line 2:" in res.stderr and "raise --memory" in res.stderr, res.stderr
    res = run_cli("pack-tokens", src, "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "--memory", "16MB",
                  "--workers", "1", "-q", "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["source"]["skipped"]["count"] == 1 and m["source"]["skipped"]["records"][0]["line"] == 2
    assert m["splits"]["train"]["samples"] == 2


def test_a_tokenizer_that_cannot_be_cut_refuses_long_documents(tmp_path):
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainers.BpeTrainer(vocab_size=200,
                                                                         special_tokens=["<unk>", "</s>"]))
    path = tmp_path / "sp.json"
    tok.save(str(path))
    assert not tk.piece_safe(Tokenizer.from_file(str(path)), [_long_text(2000)])
    src = write_jsonl(tmp_path / "in" / "a.jsonl", ["short", _long_text(200_000)])
    res = run_cli("pack-tokens", src, "-o", tmp_path / "o", "--tokenizer", path, "-q")
    assert res.exit_code == 1 and "line 2" in res.stderr and "cannot be cut" in res.stderr, res.stderr


def test_the_engine_check_encodes_a_bounded_sample(bpe_tokenizer, tmp_path):
    long = _long_text(3_000_000)
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [long])
    code, rss = _peak_rss_mb(["pack-tokens", str(src), "-o", str(tmp_path / "o"), "--tokenizer",
                              str(bpe_tokenizer), "--workers", "1", "-q", "--engine", "auto"])
    assert code == 0 and rss < 600, rss


def test_the_engine_fallback_message_is_one_whole_line():
    tok = Tokenizer.from_str(tk.train_bpe(["a b c"] * 3, vocab_size=260))
    engine, why, _, loaded = check_engine("auto", tok, "{not json\n" + "x" * 300, ["a b"], piece_docs=1)
    assert engine == "hf" and loaded is None and "\n" not in why and "[:120]" not in why


def test_the_engine_check_decides_alike_when_its_child_fails(bpe_tokenizer, monkeypatch):
    """The reference's side runs in a forked child; when that child fails, this process computes
    the reference itself and decides the same (engine, piece safety, reason)."""
    import shardsmith.commands.engine_check as ec

    tok = Tokenizer.from_file(str(bpe_tokenizer))
    sample = [" ".join(random.Random(k).choices(WORDS, k=400)) for k in range(30)]
    json_text = tok.to_str()
    checked = len(tk.PROBES) + 30 + sum(len(tk.pieces(t, 48)) for t in sample[:10])
    want = ("gigatoken", f"matched tokenizers on {checked} documents", True)
    assert ec.check_engine("auto", tok, json_text, sample, piece_docs=8)[:3] == want
    reference = ec._reference

    def fails_in_the_child(tok, texts, piece_texts, *, batch):
        if batch:  # only the child encodes in one batch
            raise RuntimeError("the child fails")
        return reference(tok, texts, piece_texts, batch=batch)

    monkeypatch.setattr(ec, "_reference", fails_in_the_child)
    assert ec.check_engine("auto", tok, json_text, sample, piece_docs=8)[:3] == want
    assert ec.check_engine("hf", tok, json_text, sample, piece_docs=8)[:3] == ("hf", "requested", True)


def test_gigatokens_batch_call_gives_the_ids_of_one_document_at_a_time(bpe_tokenizer):
    """Batches of at least BATCH_CHARS go through gigatoken's batch call (half the cost per
    document); the ids equal those of one document at a time and the reference's, pieces too."""
    tok = Tokenizer.from_file(str(bpe_tokenizer))
    spec = tk.TokenizerSpec(json=tok.to_str(), engine="gigatoken", eos_id=tok.token_to_id("<|endoftext|>"),
                            bos_id=None, vocab_size=tok.get_vocab_size(), batch_chars=tk.BATCH_CHARS)
    enc = tk.Encoder(spec)
    rng = random.Random(5)
    texts = ["", "ünïcödé — 日本語 🤖", _long_text(tk.PIECE_CHARS + 5000)]
    while sum(map(len, texts)) < tk.BATCH_CHARS + 100_000:
        texts.append(" ".join(rng.choices(WORDS, k=rng.randint(0, 2000))))
    content, lengths = enc.encode(texts)
    alone = [enc.encode([t]) for t in texts]  # each below BATCH_CHARS: one document at a time
    assert lengths.tolist() == [int(n[0]) for _, n in alone]
    assert np.array_equal(content, np.concatenate([c for c, _ in alone]))
    eos = tok.token_to_id("<|endoftext|>")
    ends = np.cumsum(lengths)
    for k in [0, 1, 3, len(texts) - 1]:  # the reference's ids, as pieces or whole
        assert content[ends[k] - lengths[k]:ends[k]].tolist() == tok.encode(texts[k], add_special_tokens=False).ids + [eos]
