"""``shardsmith pack-tokens``: text → tokenized, exactly shuffled, Megatron-compatible packed tokens.

The command describes its job (``engine.job.Job``) and the engine runs it (``engine.conduct``);
the tokenizer's work between the engine's steps is ``token_job.TokenSteps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardsmith.commands.token_job import TokenSteps, check_packing, window_of
from shardsmith.core.memory import keep_freed_memory
from shardsmith.core.words import plural
from shardsmith.engine import ConvertingOptions, Job, run_job
from shardsmith.executors.base import Executor

__all__ = ["PackTokensOptions", "check_packing", "job_of", "run", "summary_line", "window_of"]


@dataclass(frozen=True, kw_only=True)
class PackTokensOptions(ConvertingOptions):
    inputs: tuple[str, ...]
    out: Path
    tokenizer: str | None = None
    train_tokenizer: int | None = None
    text_field: str = "text"
    eos_token: str | None = None
    no_eos: bool = False
    bos_token: str | None = None
    engine: str = "auto"
    transforms: tuple[str, ...] = ()  # --transform NAME[=SPEC], applied to each row before its text is taken
    seq_len: int | None = None
    shard_tokens: int = 1_000_000_000
    nanogpt: bool = False
    pack: str | None = None  # "best-fit": fixed seq_len sequences of whole documents (formats.tokens.packing)
    pad_id: int | None = None  # the id after a packed sequence's documents [default: the tokenizer's pad, else eos]
    pack_window: int | None = None  # tokens per best-fit window [default: packing.DEFAULT_WINDOW_TOKENS]
    # --chat: conversations through the chat template, a loss bit per token (commands/chat_job.py)
    chat: bool = False
    messages_field: str = "messages"
    prompt_field: str | None = None
    completion_field: str | None = None
    chat_template: str | None = None  # a Jinja file [default: the tokenizer's, from tokenizer_config.json]
    train_on: str = "assistant"
    too_long: str | None = None  # a conversation over a packed --seq-len [default: truncate]


def job_of(opts: PackTokensOptions) -> Job:
    """The tokenization ``opts`` describe: every rows source reads the text (``--chat``: the
    conversations), the ``tokens`` format writes it."""
    from shardsmith.commands.chat_job import ChatSteps

    return Job(command="pack-tokens", steps=ChatSteps if opts.chat else TokenSteps, opts=opts,
               transforms=opts.transforms, format="tokens")


def run(opts: PackTokensOptions, *, executor: Executor | None = None) -> dict[str, Any]:
    """The whole command (or its ``--stage``), here or on ``executor`` (``shardsmith.executors``); returns the
    manifest it wrote (``--no-wait``: the jobs submitted)."""
    keep_freed_memory()
    return run_job(job_of(opts)) if executor is None else executor.run(job_of(opts))


def chat_line(manifest: dict[str, Any]) -> str:
    """The chat figures of a ``--chat`` run's summary (empty for others)."""
    chat = manifest.get("chat")
    if not chat:
        return ""
    line = (f"; --chat: {plural(chat['conversations'], 'conversation')}, trained on "
            f"{100 * chat['trained_fraction']:.1f} % of their tokens (--train-on {chat['train_on']})")
    if chat["truncated"]:
        line += f", {plural(chat['truncated'], 'conversation')} truncated to --seq-len"
    if chat["dropped_too_long"]:
        line += f", {plural(chat['dropped_too_long'], 'conversation')} over --seq-len dropped"
    return line


def summary_line(out: Path, manifest: dict[str, Any]) -> str:
    """The run's one-line summary for the CLI (with the packing figures of a packed run)."""
    from shardsmith.commands.report import cleaning_dropped

    src = manifest["source"]
    unit = "sequence" if manifest.get("packing") else "document"
    parts = ", ".join(f"{name}: {plural(s['samples'], unit)}, {plural(s['tokens'], 'token')} in "
                      f"{plural(len(s['shards']), 'shard')}" for name, s in manifest["splits"].items())
    line = (f"{out}: {parts}; {plural(src['records'], 'record')} read, {src['skipped']['count']:,} skipped; "
            f"engine {manifest['tokenizer']['engine']}")
    tok = manifest["tokenizer"]
    if tok.get("vocab_size_asked", tok["vocab_size"]) > tok["vocab_size"]:
        line += (f"; --train-tokenizer {tok['vocab_size_asked']}: trained {plural(tok['vocab_size'], 'token')} "
                 "(the corpus has no more merges)")
    line += cleaning_dropped(manifest) + chat_line(manifest)
    if (share := manifest.get("nanogpt_default_val")) is not None:
        line += f"; --nanogpt without --split: val holds the default share {share:g} of the documents"
    if (p := manifest.get("packing")) is not None:
        line += (f"; packed best-fit at {p['seq_len']}: padding {100 * p['padding_fraction']:.2f} %, "
                 f"{plural(p['documents_split'], 'document')} split of {p['documents']:,} "
                 f"({100 * p['split_fraction']:.2f} %)")
    return line
