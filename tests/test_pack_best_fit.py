"""pack-tokens --pack best-fit end to end: the sequences are exactly the packer's over the run's shuffled
documents, the loader gives tokens + cu_seqlens, megatron-core reads the shards, the bytes do not depend
on workers, --memory or a kill, and the options are checked in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_docs, run_cli, run_subprocess, tree_digest, two_file_corpus, write_jsonl

import shardsmith
from shardsmith.formats.tokens.packing import BestFitPacker
from shardsmith.loader import TokenDocuments

SMALL = ("--shard-tokens", "8K", "--split", "train=0.9,val=0.1", "--seed", "5")
WINDOW = ("--pack-window", "16K")  # several packing windows over the corpus


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 documents of up to 200 words: some longer than a short sequence, several packing windows."""
    docs = make_docs(600, seed=11, max_words=200)
    root = tmp_path_factory.mktemp("pack-corpus")
    write_jsonl(root / "a.jsonl", docs[:350])
    write_jsonl(root / "b.jsonl", docs[350:])
    return root


def pack(corpus: Path, out: Path, tokenizer: Path, *extra: str) -> dict:
    res = run_cli("pack-tokens", corpus, "-o", out, "--tokenizer", tokenizer, "--quiet", *extra)
    assert res.exit_code == 0, res.stderr
    return json.loads((out / "manifest.json").read_text())


def expected_sequences(docs: TokenDocuments, seq_len: int, window: int) -> list[list[list[int]]]:
    packer = BestFitPacker(seq_len=seq_len, window_tokens=window)
    windows = [w for i in range(len(docs)) for w in packer.add_batch(docs.lengths[i:i + 1], docs[i])]
    windows += packer.finish()
    return [[p.tolist() for p in s] for w in windows for s in w.pieces()]


@pytest.mark.parametrize("seq_len", [32, 256])
def test_sequences_are_the_packers_over_the_shuffled_documents(long_corpus, bpe_tokenizer, tmp_path, seq_len):
    plain = pack(long_corpus, tmp_path / "plain", bpe_tokenizer, *SMALL)
    m = pack(long_corpus, tmp_path / "packed", bpe_tokenizer, *SMALL, *WINDOW, "--pack", "best-fit",
             "--seq-len", str(seq_len))
    p = m["packing"]
    assert p["method"] == "best-fit" and p["seq_len"] == seq_len and p["window_tokens"] == 16_000
    assert p["window_tokens"] < sum(s["tokens"] for s in plain["splits"].values())  # several windows
    for split in ("train", "val"):
        docs = TokenDocuments(tmp_path / "plain", split=split)
        ds = shardsmith.open(tmp_path / "packed", split=split)
        want = expected_sequences(docs, seq_len, p["window_tokens"])
        assert len(ds) == len(want) == m["splits"][split]["samples"]
        for i, pieces in enumerate(want):
            item = ds[i]
            cu = item["cu_seqlens"]
            assert item["tokens"].shape == (seq_len,) and cu.dtype == np.int32
            assert cu[0] == 0 and cu.tolist() == np.cumsum([0, *map(len, pieces)]).tolist()
            got = [item["tokens"][a:b].tolist() for a, b in zip(cu[:-1], cu[1:])]
            assert got == pieces
            assert (item["tokens"][cu[-1]:] == p["pad_id"]).all()
        lengths = docs.lengths
        stats = m["splits"][split]["packing"]
        assert stats["documents"] == len(docs)
        assert stats["documents_split"] == int((lengths > seq_len).sum())
        assert stats["real_tokens"] == int(lengths.sum())
        assert stats["padding_tokens"] == len(ds) * seq_len - int(lengths.sum())
    assert m["source"]["records"] == 600 and plain["source"]["records"] == 600
    assert (p["documents_split"] > 0) == (seq_len == 32)


def test_megatron_core_reads_one_sequence_per_entry(long_corpus, bpe_tokenizer, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    m = pack(long_corpus, tmp_path / "o", bpe_tokenizer, *SMALL, "--pack", "best-fit", "--seq-len", "128")
    ds = shardsmith.open(tmp_path / "o")
    at = 0
    for shard in m["splits"]["train"]["shards"]:
        meg = IndexedDataset(str(tmp_path / "o" / shard["path"][:-len(".bin")]))
        assert len(meg) == shard["samples"]
        for j in range(len(meg)):
            assert np.array_equal(meg[j].astype(np.int64), ds[at + j]["tokens"])
        at += len(meg)
    assert at == len(ds)


def test_same_bytes_for_any_worker_count_and_memory(long_corpus, bpe_tokenizer, tmp_path):
    """The window is --pack-window, not a share of --memory: the bytes depend on neither."""
    args = (*SMALL, *WINDOW, "--pack", "best-fit", "--seq-len", "64")
    digests = []
    for workers, memory in ((1, "512KB"), (2, "1GB"), (3, "3MB")):
        pack(long_corpus, tmp_path / f"w{workers}", bpe_tokenizer, *args, "--workers", str(workers),
             "--memory", memory)
        digests.append(tree_digest(tmp_path / f"w{workers}"))
    assert digests[0] == digests[1] == digests[2]


@pytest.mark.parametrize("point", ["scatter:1", "gather:train:0", "manifest"])
def test_resumes_after_kill_9_with_the_same_bytes(tmp_path, bpe_tokenizer, point):
    import os
    import signal

    corpus = two_file_corpus(tmp_path / "c", 3000, seed=3, max_words=50, first=1700)
    args = ["pack-tokens", corpus, "--tokenizer", bpe_tokenizer, "--memory", "512KB", "--shard-tokens", "20K",
            "--split", "train=0.9,val=0.1", "--pack", "best-fit", "--seq-len", "512", "--pack-window", "8K", "-q"]
    ref = run_subprocess(*args, "-o", tmp_path / "ref", "--workers", "1")
    assert ref.returncode == 0, ref.stderr
    killed = run_subprocess(*args, "-o", tmp_path / "out", "--workers", "1",
                            env={**os.environ, "SHARDSMITH_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()
    again = run_subprocess(*args, "-o", tmp_path / "out", "--workers", "2")
    assert again.returncode == 0, again.stderr
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "ref")


def test_summary_reports_padding_and_split_documents(long_corpus, bpe_tokenizer, tmp_path):
    res = run_cli("pack-tokens", long_corpus, "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, *SMALL,
                  "--pack", "best-fit", "--seq-len", "32", "--pad-id", "3")
    assert res.exit_code == 0, res.stderr
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    p = m["packing"]
    assert f"padding {100 * p['padding_fraction']:.2f} %" in res.output
    assert f"{p['documents_split']} documents split of {p['documents']}" in res.output
    assert p["pad_id"] == 3
    assert run_cli("verify", tmp_path / "o", "--deep").exit_code == 0


def test_a_damaged_boundaries_file_is_caught(long_corpus, bpe_tokenizer, tmp_path):
    pack(long_corpus, tmp_path / "o", bpe_tokenizer, *SMALL, "--pack", "best-fit", "--seq-len", "64")
    cu = tmp_path / "o" / "train-000000.cu.npy"
    data = bytearray(cu.read_bytes())
    data[-1] ^= 0x40
    cu.write_bytes(bytes(data))
    res = run_cli("verify", tmp_path / "o")
    assert res.exit_code != 0 and "train-000000.cu.npy" in res.output


def test_a_manifest_without_boundaries_is_refused(long_corpus, bpe_tokenizer, tmp_path):
    from shardsmith.errors import DatasetError

    pack(long_corpus, tmp_path / "o", bpe_tokenizer, *SMALL, "--pack", "best-fit", "--seq-len", "64")
    path = tmp_path / "o" / "manifest.json"
    m = json.loads(path.read_text())
    del m["splits"]["train"]["shards"][0]["boundaries"]
    path.write_text(json.dumps(m))
    with pytest.raises(DatasetError, match="boundaries"):
        shardsmith.open(tmp_path / "o")


@pytest.mark.parametrize("extra, message", [
    (("--pack", "best-fit"), "--pack best-fit needs --seq-len N"),
    (("--pack", "best-fit", "--seq-len", "100000", "--pack-window", "16K"),
     "--pack-window 16,000 tokens holds fewer than 8 sequences of --seq-len 100,000: give --pack-window 800000"),
    (("--pack", "best-fit", "--seq-len", "64", "--memory", "64MB"),
     "--memory 64.0 MB cannot hold a packing window of --pack-window 4,000,000 tokens: give --memory 128.0 MB"),
    (("--pack-window", "1M",), "--pack-window sizes packed sequences: give --pack best-fit too"),
    (("--pack", "best-fit", "--seq-len", "64", "--pad-id", "400"), "--pad-id 400: outside the tokenizer's "
                                                                     "vocabulary of 400"),
    (("--pad-id", "3",), "--pad-id pads packed sequences: give --pack best-fit too"),
    (("--pack", "best-fit", "--seq-len", "64", "--nanogpt"), "does not combine with --pack"),
])
def test_options_are_checked_in_one_line(corpus, bpe_tokenizer, tmp_path, extra, message):
    root, _ = corpus
    res = run_cli("pack-tokens", root, "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "-q", *extra)
    assert res.exit_code == 2, res.output
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "manifest.json").exists()
