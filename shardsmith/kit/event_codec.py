"""The worker-side encoding of events: a chunk's events into one record each, as the format wants them.

Events come from their sources as columns (``core.events.EventChunk``), many at once; the shuffle
moves one record per event, and the format's writers are handed those records in output order
(``write_batch``, ``write_sorted``). What a record holds is the format's to say (``Format.encoder``
for the ``events`` kind gives an ``EventEncoder``), as a sample's bytes are for rows and images:
the encoder runs in the workers, so work that depends on one event alone (a cast, a truncation, a
layout of its own) is done there, in parallel, and not in the gather.

A format that gives no encoder of its own gets the neutral one (``NeutralEventEncoder``, which
``kit/sample.py``'s ``NeutralEncoder`` is too): the records of ``core.events`` (fixed fields, one
count per ragged group, each ragged field's values, all 8-byte aligned), which its writers read
back with ``core.events.decode`` (``decode_heads``, ``decode_from``: hdf5, event-tar, lance-events).

A record depends on its event alone (never on the other events of its chunk, the chunk's place or
the worker), so the bytes are the same for any ``--workers``; an encoder is pickled to the
workers, so it holds plain values (the format's options, a layout made from them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from shardsmith.core import events
from shardsmith.core.events import EventChunk, EventSchema
from shardsmith.core.ragged import join

# the records ``order`` (event ``order[k]`` is the k-th) as the buffers that make them up, in order,
# and how many buffers each record has (the same for every record): the scatter writes them as they are
Pieces = Callable[[np.ndarray], tuple[list[Any], int]]


@dataclass(frozen=True, kw_only=True)
class EventRecords:
    """One chunk's events as records: each one's size, the records in any order, and the events the
    format cannot hold. ``refused`` lists ``(event, why)`` (the event's position in the chunk):
    bad records, named by input file and entry, which ``--on-error skip`` leaves out and lists."""

    lengths: np.ndarray  # bytes of each event's record, in chunk order (int64)
    pieces: Pieces
    joined: Callable[[np.ndarray], np.ndarray] | None = None  # the records ``order`` as one uint8 array
    refused: tuple[tuple[int, str], ...] = ()

    def payload(self, order: np.ndarray) -> np.ndarray:
        """The records ``order`` back to back, uint8 (``joined``, or the pieces joined)."""
        if self.joined is not None:
            return self.joined(order)
        return join(self.pieces(order)[0])


class EventEncoder:
    """Worker side: a chunk's events into one record each (see the module). ``records`` is called
    once per chunk, with the schema its columns follow (the run's, ``WriteJob.schema``)."""

    def records(self, chunk: EventChunk, schema: EventSchema) -> EventRecords:
        raise NotImplementedError


class NeutralEventEncoder(EventEncoder):
    """The records of ``core.events`` (read back by ``core.events.decode``): what a format gets by default."""

    def records(self, chunk: EventChunk, schema: EventSchema) -> EventRecords:
        return EventRecords(lengths=events.record_lengths(chunk, schema),
                            pieces=partial(events.record_pieces, chunk, schema),
                            joined=partial(_encoded, chunk, schema))


def _encoded(chunk: EventChunk, schema: EventSchema, order: np.ndarray) -> np.ndarray:
    return events.encode(chunk, schema, order=order)[1]
