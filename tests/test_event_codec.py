"""The events kind goes through the format's encoder (``Format.encoder``, ``kit/event_codec.py``):
the neutral records every format inherits are ``core.events``' (the bytes of every events dataset
unchanged), the events an encoder refuses are bad records, and the conformance check of an events
encoder (``shardsmith.testing.events``) fails the encoders that break its contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardsmith.core.events import EventChunk, EventSchema, Field, encode, record_pieces
from shardsmith.kit.event_codec import EventEncoder, EventRecords, NeutralEventEncoder
from shardsmith.kit.format import Format, WriteJob
from shardsmith.kit.options import OptionValues
from shardsmith.testing.events import check_event_records, events_like
from shardsmith.transforms.event_payload import EventProcessor

SCHEMA = EventSchema((Field(name="id", dtype="<i8"), Field(name="pos", dtype="<f4", shape=(3,)),
                      Field(name="t", dtype="<f8", counter="n"), Field(name="q", dtype="<f2", counter="n"),
                      Field(name="j", dtype="<i2", shape=(2,), counter="m")))
MANIFEST = {"schema": SCHEMA.to_json()}


class Plain(Format):
    """A format that gives no encoder of its own."""

    name = "plain"
    accepts = ("events",)


def test_a_format_without_an_encoder_gets_core_events_records():
    """The neutral records are ``core.events.encode``'s, byte for byte, in any order and in pieces."""
    chunk = events_like(SCHEMA, n=50, seed=1)
    encoder = Plain().encoder(WriteJob(opts=None, out=Path("unused"), schema=SCHEMA), "events")
    assert isinstance(encoder, NeutralEventEncoder)
    records = encoder.records(chunk, SCHEMA)
    order = np.random.default_rng(2).permutation(50)
    lengths, payload = encode(chunk, SCHEMA, order=order)
    np.testing.assert_array_equal(records.lengths, lengths)
    assert records.payload(order).tobytes() == payload.tobytes()
    assert records.pieces(order)[1] == record_pieces(chunk, SCHEMA, order)[1]
    check_event_records(Plain(), MANIFEST)


class OddRefused(NeutralEventEncoder):
    """Neutral records, but the events of odd ``id`` refused."""

    def records(self, chunk: EventChunk, schema: EventSchema) -> EventRecords:
        made = super().records(chunk, schema)
        odd = np.flatnonzero(chunk.columns["id"] % 2)
        return EventRecords(lengths=made.lengths, pieces=made.pieces, joined=made.joined,
                            refused=tuple((int(i), f"id {chunk.columns['id'][i]} is odd") for i in odd))


def test_events_an_encoder_refuses_are_bad_records_and_the_rest_its_records():
    chunk = events_like(SCHEMA, n=40, seed=3)
    chunk.columns["id"] = np.arange(40, dtype="<i8")
    chunk.first = 100
    out = EventProcessor(schema=SCHEMA, encoder=OddRefused()).process_chunk(Any, chunk)
    assert out.records.tolist() == list(range(100, 140, 2))
    assert out.bad == [(101 + 2 * k, f"id {1 + 2 * k} is odd") for k in range(20)]
    even = chunk.take(np.arange(0, 40, 2), SCHEMA)
    order = np.random.default_rng(4).permutation(20)
    lengths, payload = encode(even, SCHEMA, order=order)
    np.testing.assert_array_equal(out.lengths, lengths)
    assert out.encode_in(order).tobytes() == payload.tobytes()  # type: ignore[misc]
    assert b"".join(bytes(p) for p in out.pieces_in(order)[0]) == payload.tobytes()  # type: ignore[misc]


class Counted(NeutralEventEncoder):
    """Each record ends with how many events its chunk had: a record that depends on its chunk."""

    def records(self, chunk: EventChunk, schema: EventSchema) -> EventRecords:
        made = super().records(chunk, schema)
        tail = np.int64(chunk.n).tobytes()

        def pieces(order: np.ndarray) -> tuple[list[Any], int]:
            inner, per = made.pieces(order)
            return [p for k in range(len(order)) for p in (*inner[k * per:(k + 1) * per], tail)], per + 1

        return EventRecords(lengths=made.lengths + 8, pieces=pieces)


class Unjoined(NeutralEventEncoder):
    """Pieces of one order, but a payload of the records in chunk order whatever order is asked."""

    def records(self, chunk: EventChunk, schema: EventSchema) -> EventRecords:
        made = super().records(chunk, schema)
        return EventRecords(lengths=made.lengths, pieces=made.pieces,
                            joined=lambda order: made.payload(np.arange(len(order))))


class Encoding(Format):
    name = "encoding"
    accepts = ("events",)

    def __init__(self, encoder: Any) -> None:
        self.given = encoder

    def encoder(self, job: WriteJob, kind: str) -> Any:
        return self.given


class RowsOnly:
    """A sample encoder given for events (what the Lance format of rows would hand its events format)."""

    def encode(self, sample: Any) -> list[bytes]:
        return []


@pytest.mark.parametrize("encoder, says", [
    (RowsOnly(), "is no EventEncoder"), (Counted(), "depends on the chunk"), (Unjoined(), "another order"),
    (EventEncoder(), None)])
def test_the_conformance_check_fails_an_encoder_that_breaks_the_contract(encoder, says):
    with pytest.raises(NotImplementedError if says is None else AssertionError, match=says):
        check_event_records(Encoding(encoder), MANIFEST)


def test_every_events_format_gives_an_events_encoder():
    """Each installed format that accepts events, asked as convert asks it (its own job), gives an
    encoder of events (the Lance format of events extends the rows' one, whose encoder is for samples)."""
    from shardsmith import registry

    fmts = [f for f in registry.formats() if "events" in f.accepts]
    assert {"hdf5", "memmap", "event-tar"} <= {f.name for f in fmts}
    for fmt in fmts:
        values = {o.name: o.default_value() for o in (fmt.options.options if fmt.options else ())}
        values.update({"max_len": 4} if "max_len" in values else {})
        job = WriteJob(opts=None, out=Path("unused"), schema=EventSchema(SCHEMA.fields[:4]),
                       options=OptionValues(values=values))
        assert isinstance(fmt.encoder(job, "events"), EventEncoder), fmt.name
