"""The memmap format's encoder (``Format.encoder`` for events): each event's record already cut to
the row it becomes, in the workers.

The one writer of a split (``writer.py``: the arrays are single files, written in order) is the
run's serial step; so the work that depends on one event alone moves to the workers, which share
it: the truncation to L values (``--keep``, with ``top``'s ranking), the cast to ``--dtype`` with
its range check, and the F fields side by side. A record (8-byte aligned, as ``core.events``')::

    [fixed fields, each padded to 8 bytes][int64 count before truncation][the kept values as
    (kept, F) rows of the dtype, padded to 8 bytes]

so the writer copies each event's values into its row whole (``records.py``) and the values an
event loses to truncation never go through the shuffle. An event with a finite value beyond the
dtype's range is refused here: a bad record, named by its input file and entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.core.events import ZEROS, EventChunk, EventSchema, head_rows, row_slices
from shardsmith.core.memory import no_gc
from shardsmith.core.ragged import slices, starts_of
from shardsmith.formats.memmap.pad import kept_rows
from shardsmith.formats.memmap.shape import Layout
from shardsmith.kit.event_codec import EventEncoder, EventRecords


class MemmapEncoder(EventEncoder):
    """Events into memmap records (see the module) for one run's ``layout`` (its schema: the records')."""

    def __init__(self, *, layout: Layout) -> None:
        self.layout = layout

    def records(self, chunk: EventChunk, schema: EventSchema) -> EventRecords:
        values, kept, refused = kept_rows(chunk, self.layout)
        head = head_rows(chunk, schema)
        nbytes = kept * (len(self.layout.features) * self.layout.dtype.itemsize)
        pad = (-nbytes) % 8
        lo = starts_of(nbytes)[:-1]
        flat = memoryview(values.view(np.uint8).reshape(-1))

        def pieces(order: np.ndarray) -> tuple[list[Any], int]:
            order = np.asarray(order, dtype=np.int64)
            at = lo[order]
            columns = [row_slices(head, order), slices(flat, at, at + nbytes[order])]
            if pad.any():
                columns.append([ZEROS[p] for p in pad[order].tolist()])
            with no_gc():
                return [piece for parts in zip(*columns) for piece in parts], len(columns)

        return EventRecords(lengths=head.shape[1] + nbytes + pad, pieces=pieces, refused=tuple(refused))
