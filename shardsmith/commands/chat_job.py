"""The steps of ``pack-tokens --chat`` (``TokenSteps`` with conversations for documents).

A row is a conversation (``--messages-field``, or ``--prompt-field``/``--completion-field``
pairs), rendered with the tokenizer's chat template (``text/chat_template.py``, as transformers
renders it) and encoded with a loss bit per token (``--train-on``); the tokens and their bits
travel together (``formats/tokens/masks.py``) and the writers put the bits beside each shard.
Nothing is added around a conversation: the template places every special token. The output
folder's ``tokenizer_config.json`` carries the template, so ``AutoTokenizer.from_pretrained(OUT)``
renders as the run did.

Details: ``--chat-template FILE``, else the ``chat_template`` of the ``tokenizer_config.json`` or
``chat_template.jinja`` beside ``--tokenizer`` (``text/chat_files.py``; named templates pick
``tool_use`` when the row has tools), with the tokenizer's special tokens as variables; encoded with
no special token added. A template error, an unknown role or a missing field is a bad record; so
is a conversation whose contents pass 4M characters (``text/chat.py`` ``MAX_CHARS``), before it is
rendered (the turn-by-turn rule renders every prefix: its cost grows with the square of the
turns). A template calling ``strftime_now`` renders the day's date, as transformers does: such a
run's bytes depend on the day. The ids come from the engine check's choice; the bits never depend
on the engine (``text/chat_tokens.py``). Packed, ``--too-long`` is applied in the worker; the counts
and messages per conversation (``Processed.stats``, summed per task in its part file; before
``--dedup``), the conversations written and the tokens trained on (the shards' bits) make the
manifest's ``chat`` record. ``--provenance`` hashes a conversation as read
(``text.chat.record_text``: its messages, or its pair, as JSON with sorted keys), which ``trace``
reads back and checks. The loader adds ``loss_mask`` to ``TokenDocuments`` and ``PackedSequences``
items; ``TokenDataset`` refuses a chat dataset (its windows would cross conversations and ignore the
mask); in a varlen batch an item without a mask (pre-training data in a mixture) trains on its real
tokens.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.commands.chat_options import too_long_of
from shardsmith.commands.token_facts import TokenizerFacts
from shardsmith.commands.token_job import TokenSteps
from shardsmith.engine import Converted, Described, JobRun
from shardsmith.engine.shuffle.scatter import summed_stats
from shardsmith.formats.tokens import neighbours
from shardsmith.formats.tokens.masks import unit_dtype
from shardsmith.text import tokenize as tk
from shardsmith.text.chat import MESSAGE_BINS, ChatFields
from shardsmith.text.chat_files import load_chat_template
from shardsmith.text.chat_processor import ChatProcessor, ChatRenderer
from shardsmith.text.chat_template import ChatTemplate
from shardsmith.text.chat_tokens import ChatEncoder

# what transformers reads a tokenizer's chat template and special tokens from, beside tokenizer.json
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class ChatSteps(TokenSteps):
    """Conversations into tokens with a loss bit each."""

    desc = "render and tokenize"

    def checked(self, opts: Any) -> Any:
        self.template: ChatTemplate = load_chat_template(tokenizer=opts.tokenizer, template_file=opts.chat_template)
        self.fields = ChatFields(messages=opts.messages_field, prompt=opts.prompt_field,
                                 completion=opts.completion_field)
        self.renderer = ChatRenderer(template=self.template, fields=self.fields, train_on=opts.train_on,
                                     transforms=self.transforms)
        return opts

    def reader_of(self, cls: Any, opts: Any) -> Any:
        return cls.for_records()  # every field of a row: the messages, the tools, a pair's halves

    def text_of(self, value: Any) -> str:
        return self.renderer.render(value)[0]

    def extra_inputs(self, run: JobRun) -> tuple[str | None, ...]:
        """The tokenizer (and the files beside it), the benchmarks, and where the template comes from."""
        opts = run.opts
        folder = Path(opts.tokenizer).parent
        beside = [str(folder / name) for name in TEMPLATE_FILES]
        beside += sorted(str(p) for p in (folder / "additional_chat_templates").glob("*.jinja"))
        return (*super().extra_inputs(run), opts.chat_template, *beside)

    def payload_dtype(self, spec: tk.TokenizerSpec) -> np.dtype:
        return unit_dtype(spec.dtype)

    def hf_files(self, facts: TokenizerFacts, opts: Any) -> dict[str, bytes]:
        variables = self.template.variables
        # the pad: the one packed sequences are padded with (so the folder's tokenizer pads as the data is)
        pad = facts.pad if opts.pack is not None else (variables.get("pad_token") or facts.pad)
        tokens = neighbours.SpecialTokens(eos=variables.get("eos_token"), bos=variables.get("bos_token"), pad=pad)
        t = self.template
        saved = [{"name": n, "template": src} for n, src in t.sources.items()] if t.named else t.sources["default"]
        return neighbours.hf_files(tokens, chat_template=saved, extra=variables)

    def make_processor(self, spec: tk.TokenizerSpec, opts: Any, *, loaded: Any, tokenizing: bool) -> Any:
        encoder = ChatEncoder(tokenizer_json=spec.json, engine=spec.engine, loaded=loaded) if tokenizing else None
        too_long = too_long_of(opts)  # None: not packed, every conversation stays whole
        return ChatProcessor(spec=spec, renderer=self.renderer, unit=unit_dtype(spec.dtype),
                             seq_len=opts.seq_len if too_long is not None else None, too_long=too_long or "split",
                             encoder=encoder, as_read=bool(opts.provenance))

    def describe(self, run: JobRun, done: Converted) -> Described:
        described = super().describe(run, done)
        opts = run.opts
        stats = summed_stats(done.results)
        shards = [s for o in done.outputs.values() for s in o.shards]
        # the conversations written (after --dedup, --decontaminate, --too-long drop), their real tokens
        written = described.written if described.written is not None else sum(s.samples for s in shards)
        tokens = sum(int(s.extra.get("real_tokens", s.extra["mask"]["tokens"])) for s in shards)
        trained = sum(int(s.extra["mask"]["trained"]) for s in shards)
        chat = {"template_sha256": self.template.sha256, "generation_blocks": self.template.has_generation,
                "messages_field": opts.messages_field if opts.prompt_field is None else None,
                "prompt_field": opts.prompt_field, "completion_field": opts.completion_field,
                "train_on": opts.train_on, "too_long": too_long_of(opts),
                "conversations": written, "tokens": tokens, "trained_tokens": trained,
                "trained_fraction": round(trained / tokens, 6) if tokens else 0.0,
                "truncated": stats.get("truncated", 0), "truncated_tokens": stats.get("truncated_tokens", 0),
                "dropped_too_long": stats.get("dropped_too_long", 0),
                "dropped_tokens": stats.get("dropped_tokens", 0),
                # messages per conversation (MESSAGE_BINS: that many or more), of those rendered and kept
                # by --too-long (before --dedup and --decontaminate, which decide later)
                "messages": {str(n): stats[f"messages:{n}"] for n in range(1, MESSAGE_BINS + 1)
                             if f"messages:{n}" in stats}}
        source = {**described.source, "messages_field": chat["messages_field"]}
        source.pop("text_field", None)
        return dataclasses.replace(described, source=source, extras={**described.extras, "chat": chat},
                                   schema={**described.schema, "loss_mask": {"kind": "mask", "bits": 1}})

