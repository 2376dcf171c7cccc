"""Train the two tokenizers the pack-tokens benchmark uses, on the first few MB of a corpus.

    python bench/make_tokenizers.py CORPUS.jsonl -o DIR [--sample-mb 4]

Writes DIR/bpe.json (byte-level BPE, vocab 32000, ``<|endoftext|>``: the gigatoken-able case)
and DIR/wordpiece.json (BERT-like WordPiece, vocab 30522, [PAD] [UNK] [CLS] [SEP] [MASK]: the
"only HF tokenizers supports it" case). Both are plain HF ``tokenizers`` tokenizer.json files.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers


def sample_texts(corpus: str | Path, mb: float) -> Iterator[str]:
    """The `text` fields of the first `mb` MB of the corpus."""
    budget = int(mb * 1e6)
    with open(corpus, "rb") as f:
        for line in f:
            budget -= len(line)
            if budget < 0:
                return
            yield orjson.loads(line)["text"]


def train_bpe(texts: list[str], vocab_size: int = 32000) -> Tokenizer:
    """GPT-2-style byte-level BPE with `<|endoftext|>` (no post-processor)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_wordpiece(texts: list[str], vocab_size: int = 30522) -> Tokenizer:
    """bert-base-uncased-style WordPiece, with its [CLS] $A [SEP] post-processor."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def make_tokenizers(corpus: str | Path, out: str | Path, sample_mb: float = 4) -> dict[str, Path]:
    """Train both tokenizers (skipping files already there); return their paths by name."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"bpe": out / "bpe.json", "wordpiece": out / "wordpiece.json"}
    texts: list[str] | None = None
    for name, train in (("bpe", train_bpe), ("wordpiece", train_wordpiece)):
        if not paths[name].exists():
            texts = texts if texts is not None else list(sample_texts(corpus, sample_mb))
            t0 = time.perf_counter()
            tok = train(texts)
            tok.save(str(paths[name]))
            print(f"trained {paths[name]} (vocab {tok.get_vocab_size()}) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus")
    ap.add_argument("-o", "--output", required=True, help="folder for bpe.json and wordpiece.json")
    ap.add_argument("--sample-mb", type=float, default=4)
    args = ap.parse_args(argv)
    make_tokenizers(args.corpus, args.output, args.sample_mb)


if __name__ == "__main__":
    main()
