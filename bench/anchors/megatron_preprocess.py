"""A RE-CREATION of Megatron-LM's ``tools/preprocess_data.py`` for the pack-tokens benchmark.

Megatron-LM's ``tools/`` folder is not shipped in any PyPI wheel (checked with ``pip download
--no-deps`` + ``unzip -l``: megatron-core 0.16.1, megatron-bridge 0.3.1, nemo-toolkit 3.0.0 and
2.7.3), so this script rebuilds its pipeline on megatron-core's public API. It is our own code,
written to behave like the original run as

    python tools/preprocess_data.py --input CORPUS.jsonl --output-prefix OUT \\
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model TOKDIR --tokenizer-hf-use-fast \\
        --append-eod --workers 2

and it keeps what decides the original's speed:
  * the main process opens the JSONL as text and feeds lines to
    ``multiprocessing.Pool(workers, initializer=...).imap(encoder.encode, fin, 32)``;
  * each worker builds the tokenizer once with megatron-core's ``build_tokenizer`` (the same
    ``HuggingFaceTokenizer`` wrapper around ``transformers.AutoTokenizer`` the original uses),
    and per line does ``json.loads``, ``tokenizer.tokenize(text)`` and appends ``tokenizer.eod``;
  * the main process writes with ``indexed_dataset.IndexedDatasetBuilder`` (dtype
    ``DType.optimal_dtype(vocab_size)``): ``add_document`` per line, then ``finalize``.
Output: ``{prefix}_text_document.bin`` / ``.idx``. No sentence splitting, no partitions.

Usage (in the anchors venv, offline): python megatron_preprocess.py --input CORPUS.jsonl
    --output-prefix OUT --tokenizer bpe.json [--eos-token "<|endoftext|>"] --workers 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from megatron.core.datasets import indexed_dataset  # noqa: E402

try:  # the module moved between megatron-core releases
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
except ImportError:
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer


def tokenizer_args(tokenizer_dir: str) -> argparse.Namespace:
    """The arguments Megatron's tokenizer options give for --tokenizer-type HuggingFaceTokenizer."""
    return argparse.Namespace(
        tokenizer_type="HuggingFaceTokenizer", tokenizer_model=tokenizer_dir, vocab_file=None, merge_file=None,
        tokenizer_special_tokens=None, tokenizer_hf_use_fast=True, trust_remote_code=False,
        tokenizer_hf_include_special_tokens=False, tokenizer_metadata=None, rank=1,
        make_vocab_size_divisible_by=128, tensor_model_parallel_size=1, vocab_extra_ids=0,
    )


def hf_tokenizer_dir(tokenizer_json: str, eos_token: str, dest: str) -> str:
    """A local HF model folder (tokenizer.json + tokenizer_config.json) for AutoTokenizer."""
    shutil.copy(tokenizer_json, Path(dest) / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_token, "model_max_length": 10**9}
    (Path(dest) / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


class Encoder:
    """Per-worker state: the tokenizer lives on the class, built by the pool initializer."""

    tokenizer = None

    def __init__(self, args: argparse.Namespace, json_key: str = "text"):
        self.args = args
        self.json_key = json_key

    def initializer(self) -> None:
        Encoder.tokenizer = build_tokenizer(self.args)

    def encode(self, json_line: str) -> tuple[list[int], list[int], int]:
        text = json.loads(json_line)[self.json_key]
        ids = Encoder.tokenizer.tokenize(text)
        lens = [len(ids)] if ids else []
        if ids:  # --append-eod: the eod token joins the document's last sentence
            ids.append(Encoder.tokenizer.eod)
            lens[-1] += 1
        return ids, lens, len(json_line)


def preprocess(input_path: str, output_prefix: str, tokenizer_dir: str, workers: int, log_interval: int = 1000) -> int:
    """Tokenize `input_path` into a Megatron indexed dataset; return the number of documents."""
    args = tokenizer_args(tokenizer_dir)
    encoder = Encoder(args)
    vocab_size = build_tokenizer(args).vocab_size
    bin_path, idx_path = f"{output_prefix}_text_document.bin", f"{output_prefix}_text_document.idx"
    builder = indexed_dataset.IndexedDatasetBuilder(bin_path, dtype=indexed_dataset.DType.optimal_dtype(vocab_size))
    start, nbytes, count = time.time(), 0, 0
    with open(input_path, encoding="utf-8") as fin, multiprocessing.Pool(workers, initializer=encoder.initializer) as pool:
        for count, (ids, lens, n) in enumerate(pool.imap(encoder.encode, fin, 32), start=1):
            nbytes += n
            builder.add_document(ids, lens)
            if count % log_interval == 0:
                dt = time.time() - start
                print(f"Processed {count} documents ({count / dt:.0f} docs/s, {nbytes / dt / 2**20:.1f} MB/s).", file=sys.stderr)
    builder.finalize(idx_path)
    return count


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Re-creation of Megatron-LM tools/preprocess_data.py (see docstring)")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output-prefix", required=True)
    ap.add_argument("--tokenizer", required=True, help="a tokenizer.json (wrapped in a temporary HF model folder)")
    ap.add_argument("--eos-token", default="<|endoftext|>")
    ap.add_argument("--workers", type=int, required=True)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        n = preprocess(args.input, args.output_prefix, hf_tokenizer_dir(args.tokenizer, args.eos_token, tmp), args.workers)
    print(f"megatron_preprocess: {n} documents -> {args.output_prefix}_text_document.bin/.idx", file=sys.stderr)


if __name__ == "__main__":
    main()
