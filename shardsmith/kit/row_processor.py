"""Rows into samples in the worker: each record's fields (``Reader.sample_fields``), after the
``--transform`` chain, as a neutral ``Sample`` with its key and text, encoded by the encoder the
chosen format gave (``Format.encoder``). What a sample becomes on disk is the format's alone: this
module names no member, column or file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shardsmith.core.sample import Identity
from shardsmith.core.text_field import why_no_text
from shardsmith.kit.processed import Processed
from shardsmith.kit.reader import Reader, RecordError, Task
from shardsmith.kit.sample import Sample, SampleEncoder
from shardsmith.kit.transform import Transform, apply_all


class RowProcessor:
    """A record a sample (one each: rows have no copies); bad records counted, never raised."""

    def __init__(self, *, reader: Reader, encoder: SampleEncoder, text_field: str | None,
                 transforms: Sequence[Transform] = ()) -> None:
        """``encoder``: the format's (``Format.encoder``); ``text_field``: the field ``--text-field``
        names, the sample's ``text`` (None: no text); ``transforms``: applied before the fields are read."""
        self.reader = reader
        self.encoder = encoder
        self.text_field = text_field
        self.transforms = list(transforms)

    def sample(self, task: Task, record: int, value: Any) -> Sample:
        """The sample of one record (RecordError: a bad record)."""
        if self.transforms:
            value = apply_all(self.transforms, value, file=task.file.rel, record=record)
        fields = self.reader.sample_fields(value)
        return Sample(key=Identity(task.file.rel, record).key(), fields=fields, text=self._text(value))

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed:
        pieces: list[Any] = []
        lengths: list[int] = []
        records: list[int] = []
        bad: list[tuple[int, str]] = []
        texts: list[str] | None = [] if self.text_field else None  # what cleaning compares
        for record, value in batch:
            try:
                sample = self.sample(task, record, value)
                encoded = self.encoder.encode(sample)
            except (RecordError, ValueError) as exc:  # (ValueError: a name the format cannot hold)
                bad.append((record, str(exc)))
                continue
            pieces.extend(encoded)
            lengths.append(sum(len(p) for p in encoded))
            records.append(record)
            if texts is not None:
                assert sample.text is not None
                texts.append(sample.text)
        payload = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        return Processed(records=np.asarray(records, dtype=np.int64), lengths=np.asarray(lengths, dtype=np.int64),
                         payload=payload, bad=bad, texts=texts)

    def _text(self, value: Any) -> str | None:
        """The text ``--text-field`` names (None without the option)."""
        if not self.text_field:
            return None
        text = value.get(self.text_field) if isinstance(value, dict) else None  # (a plugin kind's records)
        if not isinstance(text, str):
            raise RecordError(why_no_text(value, self.text_field))
        return text
