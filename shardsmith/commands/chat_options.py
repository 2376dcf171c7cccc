"""The options of ``pack-tokens --chat``, checked together before any work (one-line usage errors):
``--train-tokenizer``, ``--eos-token``, ``--bos-token``, ``--no-eos`` and ``--nanogpt`` are refused
with ``--chat``; the chat options without ``--chat``, and ``--too-long`` without ``--pack``, are usage
errors. The same checks for ``convert --to tokens --chat``: it runs this job (``convert_tokens.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from shardsmith.errors import UsageError
from shardsmith.formats.tokens.options import CHAT, TOO_LONG, TRAIN_ON

# the options that read conversations, as the tokens format declares them (their defaults are the
# options dataclass's, which a test holds equal to the declaration's)
CHAT_ONLY = tuple(o.name for o in CHAT if o.name != "chat")


def check_chat(opts: Any) -> None:
    """The chat options together, before any work (one-line usage errors); also for a run without --chat."""
    if not opts.chat:
        defaults = {f.name: f.default for f in dataclasses.fields(opts)}
        given = [f"--{name.replace('_', '-')}" for name in CHAT_ONLY if getattr(opts, name) != defaults[name]]
        if given:
            raise UsageError(f"{given[0]} reads conversations: give --chat too")
        return
    for flag, given in (("--train-tokenizer", opts.train_tokenizer is not None), ("--eos-token", opts.eos_token),
                        ("--bos-token", opts.bos_token), ("--no-eos", opts.no_eos), ("--nanogpt", opts.nanogpt)):
        if given:
            why = ("the chat template places every special token" if flag != "--nanogpt" else
                   "nanoGPT's flat files have no loss mask")
            hint = "; give --tokenizer with its chat template" if flag == "--train-tokenizer" else ""
            raise UsageError(f"--chat: {flag} does not apply ({why}){hint}")
    if (opts.prompt_field is None) != (opts.completion_field is None):
        raise UsageError("--prompt-field and --completion-field name the two halves of a pair: give both")
    if opts.train_on not in TRAIN_ON:
        raise UsageError(f"--train-on {opts.train_on!r}: one of {', '.join(TRAIN_ON)}")
    if opts.train_on == "completion" and opts.prompt_field is None:
        raise UsageError("--train-on completion trains on the completion of prompt/completion pairs: give "
                         "--prompt-field and --completion-field (or --train-on assistant)")
    if opts.too_long is not None:
        if opts.too_long not in TOO_LONG:
            raise UsageError(f"--too-long {opts.too_long!r}: one of {', '.join(TOO_LONG)}")
        if opts.pack is None:
            raise UsageError("--too-long says what to do with a conversation longer than a packed sequence: "
                             "give --pack best-fit --seq-len N too")


def too_long_of(opts: Any) -> str | None:
    """What happens to a conversation longer than ``--seq-len`` (packed runs only): truncate by default, as TRL."""
    return None if opts.pack is None else (opts.too_long or "truncate")
