"""Rows into token ids, in the worker: the text field of each record, encoded a batch at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shardsmith.core.text_field import why_no_text
from shardsmith.kit.processed import Processed
from shardsmith.kit.reader import RecordError, Task
from shardsmith.kit.transform import Transform, apply_all
from shardsmith.text import tokenize as tk


class TokenProcessor:
    """Picks the text field of each record and encodes a batch; the encoder is built in each worker."""

    def __init__(self, *, spec: tk.TokenizerSpec, text_field: str, encoder: tk.Encoder | None = None,
                 transforms: Sequence[Transform] = ()) -> None:
        """``encoder``: built in the parent, so forked workers inherit it (spawned ones build their own);
        ``transforms``: the ``--transform`` chain each row goes through before its text is taken."""
        self.spec = spec
        self.text_field = text_field
        self._encoder = encoder
        self.transforms = list(transforms)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "text_field": self.text_field, "_encoder": None, "transforms": self.transforms}

    def text_of(self, task: Task, record: int, value: Any) -> Any:
        """The row's text after the transforms (a RecordError if a transform refuses the row)."""
        if self.transforms:
            value = apply_all(self.transforms, value, file=task.file.rel, record=record)
        return value.get(self.text_field) if isinstance(value, dict) else None

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed:
        texts, records, bad = [], [], []
        raw: list[str] | None = [] if self.transforms else None  # each document's text as read
        for record, value in batch:
            try:
                text = self.text_of(task, record, value)
            except RecordError as exc:
                bad.append((record, str(exc)))
                continue
            if not isinstance(text, str):
                bad.append((record, why_no_text(value, self.text_field)))
            elif (why := tk.too_long(text, piece_chars=self.spec.piece_chars)) is not None:
                bad.append((record, why))
            else:
                texts.append(text)
                records.append(record)
                if raw is not None:
                    read = value.get(self.text_field) if isinstance(value, dict) else None
                    raw.append(read if isinstance(read, str) else "")
        if self._encoder is None:
            self._encoder = tk.Encoder(self.spec)
        flat, lengths = self._encoder.encode(texts) if texts else (np.zeros(0, self.spec.dtype), np.zeros(0, np.int64))
        return Processed(records=np.asarray(records, dtype=np.int64), lengths=lengths, payload=flat, bad=bad,
                         texts=texts, raw_texts=raw)
