"""The options of the tokens format: ``--to tokens``' and ``pack-tokens``' (light: ``convert --help``
and ``pack-tokens --help`` read it, the registry without numpy).

``pack-tokens`` writes this format, and ``convert --to tokens`` builds the same job (``command``:
``commands/convert_tokens.py``), so one table is the source of both commands' flags: convert shows
the declared ones under "Options for --to tokens", and ``pack-tokens``' click options are made from
``PACK_TOKENS`` (``cli_options.declared_options``): a flag's name, type, range, default and help are
written here once. Three groups: the tokenizer's (read by the job's steps, ``commands/token_job.py``),
the writer's (read by ``format.py`` as ``job.options``: the shards' size, the packing, nanoGPT's flat
files, the documents' origins) and the conversations' (``--chat``: ``commands/chat_job.py``, checked
together by ``commands/chat_options.py``). ``recorded=False``: the manifest holds the writer's
values where it always did (``seq_len``, ``packing``, ``nanogpt``, ``chat``), not a second time as
``format_options``.
"""

from __future__ import annotations

from shardsmith.kit.options import MAX_INT32, FormatOptions, Option

MAX_VOCAB = 1 << 24  # tokenizers trains vocabularies far below this (``--train-tokenizer``)
TRAIN_ON = ("assistant", "last", "completion", "all")  # text/chat.py's (a test holds them equal)
TOO_LONG = ("truncate", "drop", "split")

TOKENIZER = (
    Option(name="tokenizer", metavar="FILE", help="A HuggingFace tokenizer.json."),
    Option(name="train_tokenizer", type="int", low=258, high=MAX_VOCAB, metavar="VOCAB_SIZE",
           help="Train a byte-level BPE of this size on the inputs (saved as OUT/tokenizer.json)."),
    Option(name="eos_token", help="Token appended to every document [default: found]."),
    Option(name="no_eos", type="flag", help="Append no end-of-document token."),
    Option(name="bos_token", help="Token prepended to every document."),
    Option(name="engine", default="auto", choices=("auto", "hf", "gigatoken"),
           help="auto uses gigatoken where it matches tokenizers' ids on a sample of the input."),
)
WRITER = (
    Option(name="seq_len", type="int", low=1, high=MAX_INT32,
           help="Default window length recorded for TokenDataset; with --pack, every sequence's length."),
    Option(name="pack", choices=("best-fit",),
           help="Pack whole documents into --seq-len sequences (best-fit decreasing, padded at the end)."),
    # no upper bound of its own: the tokenizer's vocabulary bounds it (``token_facts.pad_id_of``)
    Option(name="pad_id", type="int", low=0, help="Padding id [default: the tokenizer's pad, else eos]."),
    Option(name="pack_window", type="size", metavar="TOKENS",
           help="Tokens of documents best-fit packs at once (--memory must hold 32 bytes per token) "
                "[default: 4M]."),
    Option(name="shard_tokens", type="size", default="1G", metavar="TOKENS",
           help="Roll over to a new .bin/.idx shard after this many tokens."),
    Option(name="nanogpt", type="flag",
           help="Also write flat train.bin/val.bin (uint16) and meta.pkl as nanoGPT reads them [default "
                "--split: a val share of 0.0005, more for a small corpus]."),
    # the converting commands' own --provenance: convert's command line keeps one flag (``cli_options``)
    Option(name="provenance", type="flag",
           help="Record each document's input file, line or row and byte offset beside every shard "
                "(shardsmith trace)."),
)
CHAT = (
    Option(name="chat", type="flag",
           help="Rows are conversations: render each with the chat template, tokenize, and store a loss mask "
                "beside the tokens."),
    Option(name="messages_field", default="messages", metavar="FIELD",
           help="--chat: the list of {role, content} messages of a row."),
    Option(name="prompt_field", metavar="FIELD",
           help="--chat: prompt/completion pairs instead (a string, or a list of messages)."),
    Option(name="completion_field", metavar="FIELD", help="--chat: the completion of a pair."),
    Option(name="chat_template", metavar="FILE",
           help="--chat: a Jinja chat template [default: the chat_template of the tokenizer_config.json beside "
                "--tokenizer]."),
    Option(name="train_on", default="assistant", choices=TRAIN_ON,
           help="--chat: the tokens the loss counts: the assistant turns, the last one, a pair's completion, or "
                "every token."),
    Option(name="too_long", choices=TOO_LONG,
           help="--chat --pack: a conversation longer than --seq-len is cut to it, left out, or split across "
                "sequences [default: truncate]."),
)

OPTIONS = FormatOptions(to="tokens", options=(*TOKENIZER, *WRITER, *CHAT), command="pack-tokens", recorded=False)

# What pack-tokens spells as its own and convert has as a command option of its own (so the format
# does not declare it: convert's ``--text-field`` defaults to no text member, and ``--to tokens``
# reads ``text`` then, as pack-tokens does)
TEXT_FIELD = Option(name="text_field", default="text", help="JSON field / Parquet column of the text.")

# pack-tokens' options, in the order of its help (``cli.py``; ``--transform`` is the converting
# commands' own, as ``--text-field`` is convert's)
PACK_TOKENS = (*TOKENIZER[:2], TEXT_FIELD, *TOKENIZER[2:], *WRITER, *CHAT)
