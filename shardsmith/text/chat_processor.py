"""Conversations into token ids and loss bits, in the worker (``pack-tokens --chat``).

Each row becomes a conversation (``text/chat.py``), rendered with the chat template and the spans
the loss counts (``--train-on``), encoded with the bits of those spans (``chat_tokens.py``). A
conversation longer than ``--seq-len`` is cut to it, left out, or kept whole for the packer to
split (``--too-long``). The payload is one ``(id, mask)`` unit per token
(``formats/tokens/masks.unit_dtype``): the rest of the run moves a token and its bit together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shardsmith.core.ragged import starts_of
from shardsmith.kit.processed import Processed
from shardsmith.kit.reader import RecordError, Task
from shardsmith.kit.transform import Transform, apply_all
from shardsmith.text import tokenize as tk
from shardsmith.text.chat import MAX_CHARS, MESSAGE_BINS, ChatFields, conversation_of, record_text, rendered
from shardsmith.text.chat_template import ChatError, ChatTemplate
from shardsmith.text.chat_tokens import ChatEncoder


class ChatRenderer:
    """A row into (rendered text, the char spans the loss counts, messages): the one way the
    workers, the engine check and the tokenizer's sample read a conversation."""

    def __init__(self, *, template: ChatTemplate, fields: ChatFields, train_on: str,
                 transforms: Sequence[Transform] = ()) -> None:
        self.template, self.fields, self.train_on = template, fields, train_on
        self.transforms = list(transforms)

    def as_read(self, value: Any) -> str:
        """The row's conversation as read, one text (what ``--provenance`` hashes, ``text.chat.record_text``)."""
        return record_text(value, self.fields)

    def render(self, value: Any, *, task: Task | None = None, record: int = 0) -> tuple[str, list[tuple[int, int]], int]:
        """(text, spans, messages); a RecordError says why the row is no conversation."""
        try:
            if self.transforms and task is not None:
                value = apply_all(self.transforms, value, file=task.file.rel, record=record)
            conv = conversation_of(value, self.fields)
            text, spans = rendered(self.template, conv, train_on=self.train_on)
        except ChatError as exc:
            raise RecordError(str(exc)) from None
        if len(text) > MAX_CHARS:
            raise RecordError(f"a conversation of {len(text):,} characters rendered: longer than the "
                              f"{MAX_CHARS:,} --chat encodes at once")
        return text, spans, len(conv.messages)


class ChatProcessor:
    """Renders and encodes a batch of conversations; the encoder is built in each worker."""

    def __init__(self, *, spec: tk.TokenizerSpec, renderer: ChatRenderer, unit: np.dtype, seq_len: int | None,
                 too_long: str, encoder: ChatEncoder | None = None, as_read: bool = False) -> None:
        """``unit``: the payload's (id, mask) dtype; ``seq_len``: the packed length ``too_long``
        applies to (None: conversations stay whole); ``encoder``: built in the parent, so forked
        workers inherit it; ``as_read``: keep each conversation as read (what ``--provenance`` hashes)."""
        self.spec, self.renderer, self.unit, self.as_read = spec, renderer, np.dtype(unit), as_read
        self.seq_len, self.too_long = seq_len, too_long
        self._encoder = encoder

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_encoder": None}

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed:
        texts: list[str] = []
        raw: list[str] | None = [] if self.as_read else None
        spans: list[list[tuple[int, int]]] = []
        records, bad, turns = [], [], []
        for record, value in batch:
            try:
                text, sp, messages = self.renderer.render(value, task=task, record=record)
            except RecordError as exc:
                bad.append((record, str(exc)))
                continue
            texts.append(text)
            if raw is not None:
                raw.append(self.renderer.as_read(value))
            spans.append(sp)
            records.append(record)
            turns.append(messages)
        if self._encoder is None:
            self._encoder = ChatEncoder(tokenizer_json=self.spec.json, engine=self.spec.engine)
        if texts:
            ids, mask, lengths = self._encoder.encode(texts, spans)
        else:
            ids, mask, lengths = np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0, np.int64)
        units = np.empty(len(ids), dtype=self.unit)
        units["id"] = ids
        units["mask"] = mask
        out = self._fitted(Processed(records=np.asarray(records, dtype=np.int64), lengths=np.asarray(lengths, np.int64),
                                     payload=units, bad=bad, texts=texts, raw_texts=raw,
                                     stats={}), np.asarray(turns, dtype=np.int64))
        return out

    @staticmethod
    def _counted(out: Processed, turns: np.ndarray) -> Processed:
        """The batch with its messages per conversation counted (of the conversations it keeps)."""
        stats = dict(out.stats or {})
        for n, count in zip(*np.unique(np.minimum(turns, MESSAGE_BINS), return_counts=True)):
            stats[f"messages:{int(n)}"] = int(count)
        out.stats = stats
        return out

    def _fitted(self, out: Processed, turns: np.ndarray) -> Processed:
        """``--too-long``: conversations over ``seq_len`` cut to it (their first tokens), left out, or
        kept whole (the packer splits them), each counted; ``turns``: messages per conversation."""
        if self.seq_len is None or self.too_long == "split" or not len(out.lengths):
            return self._counted(out, turns)
        over = out.lengths > self.seq_len
        if not over.any():
            return self._counted(out, turns)
        stats = dict(out.stats or {})
        if self.too_long == "drop":
            stats["dropped_too_long"] = int(over.sum())
            stats["dropped_tokens"] = int(out.lengths[over].sum())
            kept = out.subset(~over)
            kept.stats = stats
            return self._counted(kept, turns[~over])
        keep = np.minimum(out.lengths, self.seq_len)
        starts = starts_of(out.lengths)[:-1]
        ends = starts + keep
        # the kept tokens are runs between the cut ends: one slice copy per run, not an index per token
        breaks = np.flatnonzero(ends[:-1] != starts[1:]) + 1
        runs = zip(starts[np.r_[0, breaks]].tolist(), ends[np.r_[breaks - 1, len(ends) - 1]].tolist())
        assert out.payload is not None
        payload = np.concatenate([out.payload[a:b] for a, b in runs])
        stats["truncated"] = int(over.sum())
        stats["truncated_tokens"] = int((out.lengths - keep).sum())
        return self._counted(Processed(records=out.records, lengths=keep, payload=payload, bad=out.bad,
                                       texts=out.texts, raw_texts=out.raw_texts, stats=stats), turns)
