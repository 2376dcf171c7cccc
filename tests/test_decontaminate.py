"""pack-tokens --decontaminate: documents sharing a word n-gram with a benchmark item are dropped,
counted per benchmark file and listed with the item they matched."""

from __future__ import annotations

import json
import random
from pathlib import Path

from conftest import WORDS, make_docs, run_cli, tree_digest, write_jsonl
from test_dedup_exact import pack

from shardsmith.text.decontaminate import Benchmarks


def _words(rng: random.Random, n: int) -> list[str]:
    return [f"{rng.choice(WORDS)}{rng.randint(0, 9)}" for _ in range(n)]


def corpus(root: Path, *, seed: int = 0) -> tuple[list[str], dict[int, tuple[str, int]], Path, Path]:
    """Documents, which of them a benchmark item contaminates (doc index -> (file, 1-based line)),
    a JSONL benchmark of long items and a plain-text one of short items."""
    rng = random.Random(seed)
    long_items = [" ".join(_words(rng, 30)) for _ in range(12)]
    short_items = [" ".join(_words(rng, 4)) for _ in range(3)]
    bench = root / "bench.jsonl"
    bench.parent.mkdir(parents=True, exist_ok=True)
    bench.write_text("".join(json.dumps({"question": t, "text": t}) + "\n" + ("\n" if i == 3 else "")
                             for i, t in enumerate(long_items)))
    short = root / "short.txt"
    short.write_text("\n".join(short_items) + "\n")
    item_line = {i: 1 + i + (1 if i > 3 else 0) for i in range(len(long_items))}  # a blank line after item 3
    docs = make_docs(240, seed=seed)
    hits: dict[int, tuple[str, int]] = {}
    for d in range(0, 240, 9):
        i = rng.randrange(len(long_items))
        words = long_items[i].split()
        a = rng.randrange(0, len(words) - 13)
        piece = " ".join(words[a:a + 13])
        piece = piece.upper() if d % 2 else piece.replace(" ", "  \n")
        docs[d] = f"{docs[d]} {piece} {docs[d]}"
        hits[d] = ("bench.jsonl", item_line[i])
    for d in range(4, 240, 29):  # 12 words of an item: not contaminated
        words = long_items[d % len(long_items)].split()
        docs[d] = f"{docs[d]} {' '.join(words[5:17 - 0][:12])} x"
    for d in range(5, 240, 31):  # a short item, whole
        if d in hits:
            continue
        j = d % len(short_items)
        docs[d] = f"{docs[d]} {short_items[j]} !"
        hits[d] = ("short.txt", j + 1)
    write_jsonl(root / "in" / "a.jsonl", docs[:130])
    write_jsonl(root / "in" / "b.jsonl", docs[130:])
    return docs, hits, bench, short


def test_documents_sharing_13_words_with_an_item_are_dropped_and_listed(tmp_path, bpe_tokenizer):
    docs, hits, bench, short = corpus(tmp_path)
    m = pack(tmp_path / "in", tmp_path / "out", bpe_tokenizer, "--decontaminate", bench, "--decontaminate", short,
             "--removed", tmp_path / "removed.jsonl")
    assert m["splits"]["train"]["samples"] == len(docs) - len(hits)
    per_file = m["cleaning"]["decontaminate"]["benchmarks"]
    assert per_file[str(bench)]["items"] == 12 and per_file[str(short)]["items"] == 3
    assert per_file[str(bench)]["documents"] == sum(1 for f, _ in hits.values() if f == "bench.jsonl")
    assert per_file[str(short)]["documents"] == sum(1 for f, _ in hits.values() if f == "short.txt")
    assert m["cleaning"]["removed"]["documents"] == len(hits)
    listed = [json.loads(x) for x in (tmp_path / "removed.jsonl").read_text().splitlines()]
    want = []
    for d in sorted(hits):
        name, line = hits[d]
        f, rec = ("a.jsonl", d) if d < 130 else ("b.jsonl", d - 130)
        want.append({"file": f, "record": rec, "line": rec + 1, "rule": "decontaminate",
                     "benchmark": str(bench if name == "bench.jsonl" else short), "item": line})
    assert listed == want
    assert [list(e) for e in listed] == [list(e) for e in want]  # and the keys in this order


def test_same_bytes_for_any_workers_and_memory(tmp_path, bpe_tokenizer):
    _, _, bench, _ = corpus(tmp_path, seed=1)
    a = pack(tmp_path / "in", tmp_path / "a", bpe_tokenizer, "--decontaminate", bench)
    b = pack(tmp_path / "in", tmp_path / "b", bpe_tokenizer, "--decontaminate", bench, "--workers", "2",
             "--memory", "100KB")
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    assert a["cleaning"] == b["cleaning"]


def test_a_broken_benchmark_file_is_one_line(tmp_path, bpe_tokenizer):
    corpus(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"question": "no text"}\n')
    base = ("pack-tokens", tmp_path / "in", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "-q")
    for path, words in ((bad, "bad.jsonl:2: no string 'text' field"), (tmp_path / "gone.jsonl", "cannot read it")):
        res = run_cli(*base, "--decontaminate", path)
        assert res.exit_code == 2, res.stderr
        assert words in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_items_shorter_than_n_match_whole_and_field_is_chosen(tmp_path):
    bench = tmp_path / "b.jsonl"
    bench.write_text(json.dumps({"q": "Two  Words"}) + "\n" + json.dumps({"q": " ".join(map(str, range(20)))}) + "\n")
    b = Benchmarks.load([str(bench)], ngram=13, field="q")
    texts = ["so two words here", "two wordsmith", " ".join(map(str, range(3, 16))), " ".join(map(str, range(3, 15)))]
    assert b.match(texts).tolist() == [0, -1, 1, -1]
    assert b.item(1) == (str(bench), 2) and b.count(str(bench)) == 2


def test_very_short_items_are_said_before_the_run(tmp_path, bpe_tokenizer):
    corpus(tmp_path)
    bench = tmp_path / "tiny.txt"
    bench.write_text("the\n" + " ".join(["word"] * 20) + "\n")
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "-q",
                  "--decontaminate", bench)
    assert res.exit_code == 0, res.stderr
    assert f"warning: --decontaminate: 1 item of fewer than 4 words (the first: {bench}:1)" in res.stderr
