"""The contract of a format's events encoder (``Format.encoder`` for events, ``kit/event_codec.py``):
what the workers hand the shuffle must be one record per event, made from that event alone.

The shuffle moves records one by one and the workers encode whatever chunks the task plan gives
them, so an event's record must not depend on the chunk it came in (its neighbours, its place), or
the bytes would change with ``--workers`` or ``--memory`` in ways a small run never shows. These
checks encode random events of a dataset's own schema and options (its manifest's ``schema`` and
``format_options``, so the encoder is made as the run made it) whole, in two parts and one by
one, in a shuffled order, and after a pickle (the encoder travels to the workers).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema
from shardsmith.core.ragged import starts_of


def events_like(schema: EventSchema, *, n: int, seed: int) -> EventChunk:
    """``n`` random events of ``schema``: small values (0 to 99, any dtype holds them), 0 to 7 values
    per event in each counter's group (some events empty)."""
    rng = np.random.default_rng(seed)
    offsets = {c: starts_of(rng.integers(0, 8, n)) for c in schema.counters}
    columns = {}
    for f in schema.fields:
        rows = int(offsets[f.counter][-1]) if f.ragged else n
        columns[f.name] = rng.integers(0, 100, (rows, *f.shape)).astype(f.np_dtype)
    return EventChunk(first=0, n=n, columns=columns, offsets=offsets)


def check_event_records(fmt: Any, manifest: dict[str, Any], *, n: int = 60, seed: int = 0) -> None:
    """The format's events encoder, made for the dataset ``manifest`` describes, on ``n`` random
    events: an AssertionError saying what breaks the contract."""
    from shardsmith.kit.format import WriteJob
    from shardsmith.kit.options import OptionValues

    schema = EventSchema.from_json(manifest["schema"])
    job = WriteJob(opts=None, out=Path("unused"), schema=schema,
                   options=OptionValues(values=manifest.get("format_options") or {}))
    encoder = fmt.encoder(job, "events")
    assert callable(getattr(encoder, "records", None)), \
        f"{fmt.name}: its encoder for events ({type(encoder).__name__}) is no EventEncoder (records(chunk, schema))"
    chunk = events_like(schema, n=n, seed=seed)
    whole = encoder.records(chunk, schema)
    assert not whole.refused, f"{fmt.name}: small numbers refused: {whole.refused[:3]}"
    lengths = np.asarray(whole.lengths)
    assert lengths.shape == (n,), f"{fmt.name}: {lengths.shape} record lengths for {n} events"
    records = _split(whole.payload(np.arange(n)), lengths)
    order = np.random.default_rng(seed + 1).permutation(n)
    assert whole.payload(order).tobytes() == b"".join(records[i] for i in order), \
        f"{fmt.name}: the records in another order are not the same records reordered"
    pieces, per = whole.pieces(order)
    assert len(pieces) == per * n and b"".join(bytes(p) for p in pieces) == whole.payload(order).tobytes(), \
        f"{fmt.name}: the records' pieces ({per} a record) are not the records"
    half = n // 2
    parts = [encoder.records(chunk.take(np.arange(a, b), schema), schema) for a, b in ((0, half), (half, n))]
    again = [r for p in parts for r in _split(p.payload(np.arange(len(p.lengths))), np.asarray(p.lengths))]
    assert again == records, f"{fmt.name}: an event's record depends on the chunk it was encoded in"
    alone = encoder.records(chunk.take(np.array([n - 1]), schema), schema)
    assert alone.payload(np.arange(1)).tobytes() == records[-1], f"{fmt.name}: an event alone gets another record"
    copy = pickle.loads(pickle.dumps(encoder))
    assert copy.records(chunk, schema).payload(order).tobytes() == whole.payload(order).tobytes(), \
        f"{fmt.name}: the encoder pickled to a worker makes other records"


def _split(payload: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    data = np.asarray(payload, dtype=np.uint8).tobytes()
    assert len(data) == int(lengths.sum()), f"records of {len(data)} bytes, their lengths say {int(lengths.sum())}"
    at = starts_of(lengths)
    return [data[a:b] for a, b in zip(at[:-1].tolist(), at[1:].tolist())]
