"""Event chunks into per-event records, in the worker: one record per event, as the format's
encoder makes them (``Format.encoder`` for events: ``kit/event_codec.py``), built straight in the
order the shuffle wants, with no loop per event."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema
from shardsmith.core.provenance import Stamp, with_provenance
from shardsmith.kit.downsample import BalancePlan, balance_hashes
from shardsmith.kit.event_codec import EventEncoder
from shardsmith.kit.processed import Processed
from shardsmith.kit.reader import Task


class EventProcessor:
    """Encodes a chunk's events into per-event records in the worker.

    ``schema`` is what the reader gives; with ``provenance`` (the run's input names, in manifest
    order) each event also gets its file index and entry, and the records follow ``out_schema``.
    ``encoder``: the format's (set once the format's job is made from ``out_schema``); the events
    it refuses are bad records."""

    def __init__(self, *, schema: EventSchema, balance: BalancePlan | None = None,
                 provenance: list[str] | None = None, encoder: EventEncoder | None = None) -> None:
        self.schema = schema
        self.balance = balance  # --balance: which events of each label are kept
        self.stamp = None if provenance is None else Stamp(inputs=provenance)
        self.out_schema = schema if provenance is None else with_provenance(schema)
        self.encoder = encoder

    def process_chunk(self, task: Task, chunk: EventChunk) -> Processed:
        assert self.encoder is not None, "the format's encoder is set before the workers start"
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
        encoded = self.encoder.records(chunk, schema)
        if not encoded.refused:
            return Processed(records=records, lengths=encoded.lengths, payload=None, dropped=dropped,
                             encode_in=encoded.payload, pieces_in=encoded.pieces)
        good = np.ones(chunk.n, dtype=bool)
        good[[i for i, _ in encoded.refused]] = False
        rows = np.flatnonzero(good)  # the records handed on are the good events': their ``order`` indexes these
        return Processed(records=records[rows], lengths=encoded.lengths[rows], payload=None, dropped=dropped,
                         bad=[(int(records[i]), why) for i, why in encoded.refused],
                         encode_in=lambda order: encoded.payload(rows[order]),
                         pieces_in=lambda order: encoded.pieces(rows[order]))

    def head(self, chunk: EventChunk, n: int) -> EventChunk:
        """The first ``n`` events (for ``--limit``)."""
        return chunk.take(np.arange(n), self.schema)

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed:
        raise TypeError("event readers yield chunks, not records")
