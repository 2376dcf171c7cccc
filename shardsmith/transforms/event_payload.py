"""Event chunks into per-event records, in the worker: one payload per event (``core.events``'s
codec), built straight in the order the shuffle wants, with no loop per event."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema, encode, record_lengths, record_pieces
from shardsmith.core.provenance import Stamp, with_provenance
from shardsmith.kit.downsample import BalancePlan, balance_hashes
from shardsmith.kit.processed import Processed
from shardsmith.kit.reader import Task


class EventProcessor:
    """Encodes a chunk's events into per-event records in the worker.

    ``schema`` is what the reader gives; with ``provenance`` (the run's input names, in manifest
    order) each event also gets its file index and entry, and the records follow ``out_schema``."""

    def __init__(self, *, schema: EventSchema, balance: BalancePlan | None = None,
                 provenance: list[str] | None = None) -> None:
        self.schema = schema
        self.balance = balance  # --balance: which events of each label are kept
        self.stamp = None if provenance is None else Stamp(inputs=provenance)
        self.out_schema = schema if provenance is None else with_provenance(schema)

    def process_chunk(self, task: Task, chunk: EventChunk) -> Processed:
        records = np.arange(chunk.first, chunk.first + chunk.n, dtype=np.int64)
        schema = self.schema
        dropped = 0
        if self.balance is not None:
            keep = self.balance.keep(chunk.columns[self.balance.spec.label or ""].reshape(-1),
                                     balance_hashes(self.balance.seed, task.file.rel, records))
            if not keep.all():
                kept = np.flatnonzero(keep)
                chunk, records, dropped = chunk.take(kept, schema), records[kept], len(records) - len(kept)
        if self.stamp is not None:
            chunk, schema = self.stamp(chunk, task.file.rel, records), self.out_schema
        return Processed(records=records, lengths=record_lengths(chunk, schema), payload=None, dropped=dropped,
                         encode_in=lambda order: encode(chunk, schema, order=order)[1],
                         pieces_in=lambda order: record_pieces(chunk, schema, order))

    def head(self, chunk: EventChunk, n: int) -> EventChunk:
        """The first ``n`` events (for ``--limit``)."""
        return chunk.take(np.arange(n), self.schema)

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed:
        raise TypeError("event readers yield chunks, not records")
