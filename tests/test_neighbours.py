"""The files the next tools read beside the shards, read by those tools (issue 17 points 1 and 2):
nanoGPT's ``meta.pkl`` and ``val.bin``, transformers' and megatron-core's tokenizer folder."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import make_docs, run_cli, write_jsonl

import shardsmith
from shardsmith.commands import nanogpt_split

EOS = "<|endoftext|>"


def pack(inputs: Path, out: Path, tokenizer: Path, *extra: str) -> tuple[dict, str]:
    res = run_cli("pack-tokens", inputs, "-o", out, "--tokenizer", tokenizer, "--quiet", *extra)
    assert res.exit_code == 0, res.stderr
    return json.loads((out / "manifest.json").read_text()), res.output


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 documents: too few for nanoGPT's 0.0005 (1.5 expected, none drawn in a fifth of such
    corpora), so the default share rises to hold about 20."""
    root = tmp_path_factory.mktemp("big")
    write_jsonl(root / "a.jsonl", make_docs(3000))
    return root


def test_nanogpt_files_read_as_train_py_reads_them(big_corpus, bpe_tokenizer, tmp_path):
    """nanoGPT's ``train.py`` cannot be installed; these are the lines of it that read our files::

        data = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')  # get_batch
        data = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i+1:i+1+block_size]).astype(np.int64)) for i in ix])
        ...
        meta_path = os.path.join(data_dir, 'meta.pkl')
        with open(meta_path, 'rb') as f:
            meta = pickle.load(f)
        meta_vocab_size = meta['vocab_size']
        model_args['vocab_size'] = meta_vocab_size if meta_vocab_size is not None else 50304

    Without ``--split``, ``--nanogpt`` holds out a default val share, and says so."""
    import torch

    data_dir = tmp_path / "out"
    m, summary = pack(big_corpus, data_dir, bpe_tokenizer, "--nanogpt")
    assert "val holds the default share 0.0056 of the documents" in summary
    assert m["nanogpt_default_val"] == 0.0056 and set(m["nanogpt"]) == {"train", "val"}

    meta_path = os.path.join(data_dir, "meta.pkl")
    raw = Path(meta_path).read_bytes()
    assert raw[:2] == b"\x80\x04"  # pickle protocol 4
    with open(meta_path, "rb") as f:
        meta = pickle.load(f)
    assert meta == {"vocab_size": m["tokenizer"]["vocab_size"]} and type(meta["vocab_size"]) is int
    embedding = torch.nn.Embedding(meta["vocab_size"], 4)

    block_size, batch_size = 16, 4
    torch.manual_seed(0)

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        if split == "train":
            data = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")
        else:
            data = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
        return x, y

    for split in ("train", "val"):
        x, y = get_batch(split)
        assert x.shape == y.shape == (batch_size, block_size)
        assert embedding(x).shape == (batch_size, block_size, 4)  # every id inside the embedding
        docs = shardsmith.open(data_dir, split=split)
        flat = np.concatenate([docs[i] for i in range(len(docs))])
        assert np.array_equal(np.memmap(data_dir / f"{split}.bin", dtype=np.uint16, mode="r"), flat)
    assert m["splits"]["val"]["samples"] == 17


def test_the_default_share_of_a_big_and_of_a_small_corpus():
    big = nanogpt_split.Sample(texts=["x" * 1000] * 100, chars=100_000, whole=False)
    assert nanogpt_split.default_share(big, input_bytes=10 << 30) == 0.0005  # ~10 M documents: nanoGPT's share
    assert nanogpt_split.default_share(big, input_bytes=10 << 20) == 0.0019  # ~10,000 documents: ~20 in val
    small = nanogpt_split.Sample(texts=["a b"] * 300, chars=900, whole=True)  # the whole input: 300 documents
    assert nanogpt_split.default_share(small, input_bytes=10 << 20) == 0.067
    assert nanogpt_split.default_share(nanogpt_split.Sample(texts=["a"] * 5, chars=5, whole=True),
                                       input_bytes=50) == 0.1  # never more than shakespeare's 0.1


def test_a_tiny_corpus_is_refused_in_one_line_and_a_larger_share_makes_its_val_bin(bpe_tokenizer, tmp_path):
    """20 documents: the default share (0.1 here) drew none of them for val (as 12 % of such corpora;
    which ones, the hashes of their identities, ``a.jsonl`` and the line number, decide)."""
    tiny = write_jsonl(tmp_path / "tiny" / "a.jsonl", make_docs(20)).parent
    out = tmp_path / "out"
    res = run_cli("pack-tokens", tiny, "--tokenizer", bpe_tokenizer, "--nanogpt", "-q", "-o", out)
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "default val share of --nanogpt left the val split empty (20 documents" \
        in res.stderr
    assert "--split train=0.8,val=0.2" in res.stderr  # a share that holds about 20 of its documents
    assert not out.exists()  # nothing left that would refuse the corrected command
    m, summary = pack(tiny, out, bpe_tokenizer, "--nanogpt", "--split", "train=0.8,val=0.2")
    assert "default share" not in summary and "nanogpt_default_val" not in m
    assert (out / "val.bin").stat().st_size > 0 and (out / "train.bin").stat().st_size > 0


def test_nanogpt_splits_must_name_train_and_val(bpe_tokenizer, tmp_path):
    tiny = write_jsonl(tmp_path / "tiny.jsonl", make_docs(5))
    res = run_cli("pack-tokens", tiny, "--tokenizer", bpe_tokenizer, "--nanogpt", "--split", "train=0.8,test=0.2",
                  "-q", "-o", tmp_path / "out")
    assert res.exit_code == 2 and "name a train and a val split" in res.stderr, res.stderr


def _megatron_eod(folder: Path) -> int | None:
    """megatron-core's tokenizer as its training scripts build it from ``--tokenizer-type
    HuggingFaceTokenizer --tokenizer-model FOLDER`` (megatron.core.tokenizers build_tokenizer)."""
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer

    args = SimpleNamespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(folder), vocab_file=None,
                           merge_file=None, tokenizer_special_tokens=None, tokenizer_hf_use_fast=True,
                           trust_remote_code=False, tokenizer_hf_include_special_tokens=False,
                           tokenizer_metadata=None)
    return build_tokenizer(args).eod


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_transformers_and_megatron_know_the_end_of_document(corpus, bpe_tokenizer, tmp_path):
    """``AutoTokenizer.from_pretrained(out)`` and megatron-core's HF tokenizer find eos (and the pad
    of packed sequences) in the folder; without the two small files neither knows any eos."""
    from transformers import AutoTokenizer

    root, docs = corpus
    out = tmp_path / "out"
    m, _ = pack(root, out, bpe_tokenizer, "--no-shuffle")
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == EOS and tok.eos_token_id == m["tokenizer"]["eos_id"]
    assert tok.bos_token is None and tok.pad_token is None
    first = shardsmith.open(out, split="train")[0].tolist()
    assert tok(docs[0], add_special_tokens=False).input_ids + [tok.eos_token_id] == first
    assert tok.decode(first[:-1]) == docs[0]
    assert _megatron_eod(out) == m["tokenizer"]["eos_id"]
    assert {e["path"] for e in m["files"]} >= {"tokenizer_config.json", "special_tokens_map.json"}

    bare = tmp_path / "bare"  # what a user had before: tokenizer.json alone
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((out / "tokenizer.json").read_bytes())
    assert AutoTokenizer.from_pretrained(bare).eos_token is None and _megatron_eod(bare) is None

    packed = tmp_path / "packed"
    m, _ = pack(root, packed, bpe_tokenizer, "--pack", "best-fit", "--seq-len", "64", "--bos-token", EOS)
    tok = AutoTokenizer.from_pretrained(packed)
    assert (tok.eos_token, tok.bos_token, tok.pad_token) == (EOS, EOS, EOS)
    assert tok.pad_token_id == m["packing"]["pad_id"]


def test_a_found_pad_token_and_verify_covers_the_files(corpus, wordpiece_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    root, _ = corpus
    out = tmp_path / "out"
    pack(root, out, wordpiece_tokenizer, "--eos-token", "[SEP]")
    assert json.loads((out / "special_tokens_map.json").read_text()) == {"eos_token": "[SEP]", "pad_token": "[PAD]"}
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.eos_token, tok.pad_token, tok.pad_token_id) == ("[SEP]", "[PAD]", 0)
    assert run_cli("verify", out).exit_code == 0
    (out / "tokenizer_config.json").write_text("{}\n")
    res = run_cli("verify", out)
    assert res.exit_code != 0 and "tokenizer_config.json" in res.output + res.stderr


def test_the_token_dtype_is_megatron_cores_choice():
    """megatron-core 0.16 ``DType.optimal_dtype(cardinality)``: uint16 below 65,500, else int32 (its
    preprocess_data.py calls it with the vocabulary size): shards of either dtype read the same there."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType

    from shardsmith.core.dtypes import token_dtype

    for vocab in (258, 50257, 65499, 65500, 65535, 65536, 100277):
        assert token_dtype(vocab) == np.dtype(DType.optimal_dtype(vocab)), vocab
