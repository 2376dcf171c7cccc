"""The options of ``--to tokens`` (light: ``convert --help`` reads it, the registry without numpy).

``pack-tokens`` writes this format, and ``convert --to tokens`` builds the same job (``command``:
``commands/convert_tokens.py``), so the flags are spelled as ``pack-tokens`` spells them. Two
groups: the tokenizer's (read by the job's steps, ``commands/token_job.py``) and the writer's (read
by ``format.py`` as ``job.options``: the shards' size, the packing, nanoGPT's flat files, the
documents' origins). ``recorded=False``: the manifest holds the writer's values where it always
did (``seq_len``, ``packing``, ``nanogpt``), not a second time as ``format_options``.
"""

from __future__ import annotations

from shardsmith.kit.options import MAX_COUNT, MAX_INT32, FormatOptions, Option

MAX_VOCAB = 1 << 24  # tokenizers trains vocabularies far below this (as ``pack-tokens --train-tokenizer``)

TOKENIZER = (
    Option(name="tokenizer", metavar="FILE", help="Tokens: a HuggingFace tokenizer.json."),
    Option(name="train_tokenizer", type="int", low=258, high=MAX_VOCAB, metavar="VOCAB_SIZE",
           help="Tokens: train a byte-level BPE of this size on the inputs (saved as OUT/tokenizer.json)."),
    Option(name="eos_token", help="Tokens: the token appended to every document [default: found]."),
    Option(name="no_eos", type="flag", help="Tokens: append no end-of-document token."),
    Option(name="bos_token", help="Tokens: the token prepended to every document."),
    Option(name="engine", default="auto", choices=("auto", "hf", "gigatoken"),
           help="Tokens: auto uses gigatoken where it matches tokenizers' ids on a sample of the input."),
)
WRITER = (
    Option(name="seq_len", type="int", low=1, high=MAX_INT32,
           help="Tokens: default window length recorded for TokenDataset; with --pack, every sequence's length."),
    Option(name="pack", choices=("best-fit",),
           help="Tokens: pack whole documents into --seq-len sequences (best-fit decreasing, padded at the end)."),
    Option(name="pad_id", type="int", low=0, high=MAX_COUNT,
           help="Tokens: padding id [default: the tokenizer's pad, else eos]."),
    Option(name="pack_window", type="size", metavar="TOKENS",
           help="Tokens: tokens of documents best-fit packs at once [default: 4M]."),
    Option(name="shard_tokens", type="size", default="1G", metavar="TOKENS",
           help="Tokens: roll over to a new .bin/.idx shard after this many tokens."),
    Option(name="nanogpt", type="flag",
           help="Tokens: also write flat train.bin/val.bin (uint16) and meta.pkl as nanoGPT reads them."),
    # the converting commands' own --provenance: the command line keeps one flag (``cli_options``)
    Option(name="provenance", type="flag",
           help="Record each document's input file, line or row and byte offset beside every shard."),
)

OPTIONS = FormatOptions(to="tokens", options=(*TOKENIZER, *WRITER), command="pack-tokens", recorded=False)
