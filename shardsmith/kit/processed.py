"""What a transform hands the scatter for a batch of records: the good records' numbers, their
payloads, and the bad ones (``Processed``), and the protocol of what makes it (``Processor``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shardsmith.core.ragged import take_ragged


@dataclass(slots=True)
class Processed:
    """A transformed batch: the good records' numbers, their payloads back to back, and the bad ones."""

    records: np.ndarray
    lengths: np.ndarray
    payload: np.ndarray | None  # None: built on demand by ``encode_in``
    bad: list[tuple[int, str]] = field(default_factory=list)
    copies: int = 1  # with K copies per record, sample numbers are record * K + copy
    # builds the payload (uint8) with the records straight in a given order, instead of a copy
    # reordering it; ``lengths`` are then bytes
    encode_in: Callable[[np.ndarray], np.ndarray] | None = None
    dropped: int = 0  # records left out on purpose (--balance: kit/downsample.py), not bad ones
    # the records in a given order as the buffers that make them up, and how many each record has
    # (the same for all): written to the part file as they are, with no joined payload
    pieces_in: Callable[[np.ndarray], tuple[list[Any], int]] | None = None
    # a processor whose records are documents: each good record's text as it was encoded (what
    # --dedup and --decontaminate compare), and as it was read, where a transform changed it
    texts: list[str] | None = None
    raw_texts: list[str] | None = None
    normalized: Sequence[str] | None = None  # ``texts`` normalized, once, when a cleaning rule compares them so
    # what the processor counted in the batch, by name (e.g. --chat's conversations truncated): summed
    # per task, kept in its part file and handed to the command's ``describe`` (``TaskResult.stats``)
    stats: dict[str, int] | None = None

    def subset(self, keep: np.ndarray) -> Processed:
        """The records ``keep`` (a bool mask) selects, with their payloads (the others dropped on purpose)."""
        rows = np.flatnonzero(keep)
        byte_lengths = self.byte_lengths()
        payload = None if self.payload is None else \
            take_ragged(self.payload.view(np.uint8), byte_lengths, rows).view(self.payload.dtype)
        encode_in = None if self.encode_in is None else (lambda order, f=self.encode_in: f(rows[order]))
        pieces_in = None if self.pieces_in is None else (lambda order, f=self.pieces_in: f(rows[order]))

        def pick(xs: Sequence[str] | None) -> list[str] | None:
            return None if xs is None else [xs[i] for i in rows.tolist()]

        return Processed(records=self.records[rows], lengths=self.lengths[rows], payload=payload, bad=self.bad,
                         copies=self.copies, encode_in=encode_in, dropped=self.dropped + len(self.records) - len(rows),
                         pieces_in=pieces_in, texts=pick(self.texts), raw_texts=pick(self.raw_texts),
                         normalized=pick(self.normalized), stats=self.stats)

    def byte_lengths(self) -> np.ndarray:
        size = 1 if self.payload is None else self.payload.dtype.itemsize
        return self.lengths.astype(np.int64) * size

    def payload_in(self, order: np.ndarray, byte_lengths: np.ndarray) -> np.ndarray:
        """The records ``order`` back to back, as bytes."""
        if self.encode_in is not None:
            return self.encode_in(order)
        assert self.payload is not None
        return take_ragged(self.payload.view(np.uint8), byte_lengths, order)


class Processor(Protocol):
    """Turns a batch of ``(record number, value)`` into payloads; built lazily in each worker."""

    def process(self, task: Any, batch: list[tuple[int, Any]]) -> Processed: ...
