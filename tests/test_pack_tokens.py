"""pack-tokens end to end, through the CLI: ids, order, splits, shards, formats other tools read."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
from conftest import make_docs, run_cli, tree_digest, write_jsonl

import shardsmith
from shardsmith.kit.keys import shuffle_keys


def reference_ids(tokenizer: Path, docs: list[str], *, eos: str | None = "<|endoftext|>") -> list[list[int]]:
    """What a user would get encoding each document directly with HF tokenizers."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    tok.no_truncation()
    tok.no_padding()
    tail = [tok.token_to_id(eos)] if eos else []
    return [e.ids + tail for e in tok.encode_batch(docs, add_special_tokens=False)]


def pack(corpus: Path, out: Path, tokenizer: Path, *extra: str) -> dict:
    res = run_cli("pack-tokens", corpus, "-o", out, "--tokenizer", tokenizer, "--quiet", *extra)
    assert res.exit_code == 0, res.stderr
    return json.loads((out / "manifest.json").read_text())


def documents(out: Path, split: str = "train") -> list[list[int]]:
    ds = shardsmith.open(out, split=split)
    return [ds[i].tolist() for i in range(len(ds))]


def test_every_document_equals_a_direct_encode_in_shuffle_key_order(corpus, bpe_tokenizer, tmp_path):
    root, docs = corpus
    m = pack(root, tmp_path / "out", bpe_tokenizer, "--seed", "7")
    want = reference_ids(bpe_tokenizer, docs)
    # identities: (relative path, line number); the output order is the docs sorted by key
    ident = [("a.jsonl", i) for i in range(170)] + [("sub/b.jsonl", i) for i in range(130)]
    keys = [int(shuffle_keys(7, rel, np.array([rec]))[0]) for rel, rec in ident]
    expected = [want[i] for i in sorted(range(len(docs)), key=lambda i: keys[i])]
    assert documents(tmp_path / "out") == expected
    assert m["splits"]["train"]["samples"] == 300
    assert m["splits"]["train"]["tokens"] == sum(map(len, want))
    assert m["tokenizer"]["engine"] == "gigatoken"
    assert m["source"]["records"] == 300 and m["source"]["skipped"]["count"] == 0


def test_no_shuffle_keeps_input_order_and_engines_agree(corpus, bpe_tokenizer, tmp_path):
    root, docs = corpus
    pack(root, tmp_path / "g", bpe_tokenizer, "--no-shuffle", "--engine", "gigatoken")
    pack(root, tmp_path / "h", bpe_tokenizer, "--no-shuffle", "--engine", "hf")
    assert documents(tmp_path / "g") == reference_ids(bpe_tokenizer, docs)
    assert tree_digest(tmp_path / "g") == tree_digest(tmp_path / "h")


def test_wordpiece_has_truncation_padding_and_specials_switched_off(corpus, wordpiece_tokenizer, tmp_path):
    root, docs = corpus
    m = pack(root, tmp_path / "out", wordpiece_tokenizer, "--no-shuffle")
    assert m["tokenizer"]["engine"] == "hf"  # gigatoken does not do WordPiece
    assert m["tokenizer"]["eos_token"] == "[SEP]"
    got = documents(tmp_path / "out")
    assert got == reference_ids(wordpiece_tokenizer, docs, eos="[SEP]")
    assert max(map(len, got)) > 16  # truncation at 16 is off
    cls = 2
    assert all(d[0] != cls for d in got)  # no [CLS] from the post-processor


def test_workers_and_memory_never_change_the_bytes(corpus, bpe_tokenizer, tmp_path):
    root, _ = corpus
    pack(root, tmp_path / "w1", bpe_tokenizer, "--workers", "1")
    pack(root, tmp_path / "w2", bpe_tokenizer, "--workers", "2")
    # a tiny budget: many buckets, many part files (1 MB chunks), groups spilled and sorted one by one
    pack(root, tmp_path / "spill", bpe_tokenizer, "--workers", "2", "--memory", "1KB")
    assert tree_digest(tmp_path / "w1") == tree_digest(tmp_path / "w2") == tree_digest(tmp_path / "spill")


def test_spill_with_many_buckets_matches_in_memory(tmp_path, bpe_tokenizer):
    docs = make_docs(3000, seed=3)
    write_jsonl(tmp_path / "in" / "big.jsonl", docs)
    small = pack(tmp_path / "in", tmp_path / "small", bpe_tokenizer, "--memory", "2MB", "--workers", "2")
    pack(tmp_path / "in", tmp_path / "big", bpe_tokenizer, "--memory", "1GB", "--workers", "1")
    assert tree_digest(tmp_path / "small") == tree_digest(tmp_path / "big")
    assert Counter(map(tuple, documents(tmp_path / "small"))) == Counter(map(tuple, reference_ids(bpe_tokenizer, docs)))
    assert small["splits"]["train"]["samples"] == 3000


def test_splits_are_hash_stable_across_seeds(corpus, bpe_tokenizer, tmp_path):
    root, _ = corpus
    a = pack(root, tmp_path / "a", bpe_tokenizer, "--split", "train=0.8,val=0.2", "--seed", "1")
    pack(root, tmp_path / "b", bpe_tokenizer, "--split", "train=0.8,val=0.2", "--seed", "2")
    assert 30 < a["splits"]["val"]["samples"] < 90
    assert a["splits"]["train"]["samples"] + a["splits"]["val"]["samples"] == 300
    val_a, val_b = documents(tmp_path / "a", "val"), documents(tmp_path / "b", "val")
    assert sorted(val_a) == sorted(val_b) and val_a != val_b  # same members, another order


def test_shard_rollover_and_megatron_reads_every_prefix(corpus, bpe_tokenizer, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    root, docs = corpus
    m = pack(root, tmp_path / "out", bpe_tokenizer, "--shard-tokens", "2000", "--no-shuffle")
    shards = m["splits"]["train"]["shards"]
    assert len(shards) > 3
    assert all(s["tokens"] <= 2000 for s in shards)
    seen = []
    for s in shards:
        prefix = str(tmp_path / "out" / s["path"][: -len(".bin")])
        ds = IndexedDataset(prefix)
        assert len(ds) == s["samples"]
        seen += [ds[i].tolist() for i in range(len(ds))]
        assert ds.sequence_lengths.sum() == s["tokens"]
        assert list(ds.document_indices) == list(range(len(ds) + 1))
    assert seen == reference_ids(bpe_tokenizer, docs)


def test_nanogpt_flat_files_equal_the_shards(corpus, bpe_tokenizer, tmp_path):
    root, _ = corpus
    m = pack(root, tmp_path / "out", bpe_tokenizer, "--nanogpt", "--split", "train=0.9,val=0.1",
             "--shard-tokens", "1500")
    for split in ("train", "val"):
        flat = np.memmap(tmp_path / "out" / f"{split}.bin", dtype=np.uint16, mode="r")
        shards = b"".join((tmp_path / "out" / s["path"]).read_bytes() for s in m["splits"][split]["shards"])
        assert flat.tobytes() == shards
        assert m["nanogpt"][split]["path"] == f"{split}.bin"


def test_compressed_and_parquet_inputs(tmp_path, bpe_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    docs = make_docs(90, seed=5)
    root = tmp_path / "in"
    root.mkdir()
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs[:30]).encode()
    (root / "a.jsonl.gz").write_bytes(gzip.compress(lines))
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs[30:60]).encode()
    (root / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    pq.write_table(pa.table({"text": docs[60:], "n": list(range(30))}), root / "c.parquet", row_group_size=7)
    m = pack(root, tmp_path / "out", bpe_tokenizer, "--no-shuffle")
    assert documents(tmp_path / "out") == reference_ids(bpe_tokenizer, docs)
    assert m["source"]["reader"] == "jsonl+parquet"


def test_eos_bos_options(corpus, bpe_tokenizer, tmp_path):
    root, docs = corpus
    pack(root, tmp_path / "none", bpe_tokenizer, "--no-shuffle", "--no-eos")
    assert documents(tmp_path / "none") == reference_ids(bpe_tokenizer, docs, eos=None)
    pack(root, tmp_path / "bos", bpe_tokenizer, "--no-shuffle", "--bos-token", "<|endoftext|>")
    got = documents(tmp_path / "bos")
    assert got == [[0, *d] for d in reference_ids(bpe_tokenizer, docs)]


def test_train_tokenizer_is_saved_and_deterministic(corpus, tmp_path):
    root, docs = corpus
    for name in ("a", "b"):
        r = run_cli("pack-tokens", root, "-o", tmp_path / name, "--train-tokenizer", "300", "--quiet")
        assert r.exit_code == 0, r.stderr
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["tokenizer"]["trained"] and m["tokenizer"]["vocab_size"] == 300
    assert m["tokenizer"]["eos_token"] == "<|endoftext|>"
    tok = tmp_path / "a" / "tokenizer.json"
    assert Counter(map(tuple, documents(tmp_path / "a"))) == Counter(map(tuple, reference_ids(tok, docs)))


def word_level_tokenizer(path: Path, words: int) -> Path:
    """Words w0..w{words-1} as ids 0..words-1, then [UNK] and </s>: ids placed exactly where a test wants."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(words)}
    vocab["[UNK]"] = words
    vocab["</s>"] = words + 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["</s>"])
    tok.save(str(path))
    return path


def test_large_vocab_uses_int32(tmp_path):
    word_level_tokenizer(tmp_path / "wl.json", 70000)
    write_jsonl(tmp_path / "in" / "a.jsonl", ["w1 w69999 zzz", "w65535 w65536"])
    m = pack(tmp_path / "in", tmp_path / "out", tmp_path / "wl.json", "--no-shuffle")
    assert m["tokenizer"]["dtype"] == "int32"
    assert documents(tmp_path / "out") == [[1, 69999, 70000, 70001], [65535, 65536, 70001]]


def test_limit_reads_only_the_first_records(corpus, bpe_tokenizer, tmp_path):
    root, docs = corpus
    m = pack(root, tmp_path / "out", bpe_tokenizer, "--no-shuffle", "--limit", "200")
    assert m["source"]["records"] == 200
    assert documents(tmp_path / "out") == reference_ids(bpe_tokenizer, docs[:200])


def test_inspect_and_bench(corpus, bpe_tokenizer, tmp_path):
    root, _ = corpus
    pack(root, tmp_path / "out", bpe_tokenizer, "--seq-len", "32")
    r = run_cli("inspect", tmp_path / "out", "--json")
    info = json.loads(r.output)
    assert info["splits"]["train"]["samples"] == 300 and info["tokenizer"]["vocab_size"] == 400
    assert info["samples"][0]["text"].startswith("doc ")
    r = run_cli("inspect", tmp_path / "out")
    assert "split train: 300 samples" in r.output
    r = run_cli("bench", tmp_path / "out", "--seconds", "0.2")
    assert r.exit_code == 0 and "tokens/s" in r.output
    r = run_cli("bench", tmp_path / "out", "--seconds", "0.2", "--target-tokens-per-s", "1e15")
    assert r.exit_code == 1 and "does NOT keep up" in r.output


def test_output_folder_is_not_clobbered(corpus, bpe_tokenizer, tmp_path):
    root, _ = corpus
    pack(root, tmp_path / "out", bpe_tokenizer)
    r = run_cli("pack-tokens", root, "-o", tmp_path / "out", "--tokenizer", bpe_tokenizer, "--quiet", "--seed", "3")
    assert r.exit_code == 2 and "--overwrite" in r.stderr
    pack(root, tmp_path / "out", bpe_tokenizer, "--overwrite", "--seed", "3")
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["seed"] == 3


def test_empty_documents_and_nanogpt_for_a_vocab_just_under_uint16(tmp_path):
    word_level_tokenizer(tmp_path / "wl.json", 65510)
    write_jsonl(tmp_path / "in" / "a.jsonl", ["w1 w65509", "", "w65000"])
    # nanoGPT needs a val.bin: the split draws of the three documents are 0.561, 0.556, 0.505
    m = pack(tmp_path / "in", tmp_path / "out", tmp_path / "wl.json", "--no-shuffle", "--nanogpt",
             "--split", "train=0.56,val=0.44")
    assert m["tokenizer"]["dtype"] == "int32" and m["nanogpt"]["train"]["dtype"] == "uint16"
    flat = [np.fromfile(tmp_path / "out" / f"{split}.bin", dtype=np.uint16).tolist() for split in ("train", "val")]
    assert flat == [[65511, 65000, 65511], [1, 65509, 65511]]
    pack(tmp_path / "in", tmp_path / "none", tmp_path / "wl.json", "--no-shuffle", "--no-eos")
    docs = shardsmith.open(tmp_path / "none")
    assert [docs[i].tolist() for i in range(3)] == [[1, 65509], [], [65000]]
