"""Batches of events as columns (``EventBatch``, ``Ragged``), and the helpers that assemble ragged
fields from several shards' memory maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import getitem
from typing import Any

import numpy as np

from shardsmith.core import recycle
from shardsmith.core.events import EventChunk, EventSchema, Field
from shardsmith.core.memory import no_gc
from shardsmith.core.ragged import RUN_BYTES, join, starts_of


@dataclass(slots=True)
class Ragged:
    """One ragged field of a batch: event k is ``values[offsets[k]:offsets[k + 1]]``.

    Fields of one counter share the same ``offsets`` array object.
    """

    values: np.ndarray
    offsets: np.ndarray  # int64, (B + 1,), starting at 0

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, k: int) -> np.ndarray:
        return self.values[self.offsets[k]:self.offsets[k + 1]]


@dataclass(slots=True)
class EventBatch:
    """B events as columns: ``fixed[name]`` is (B, *shape); ``ragged[name]`` is a ``Ragged``."""

    schema: EventSchema
    fixed: dict[str, np.ndarray]
    ragged: dict[str, Ragged]
    n: int

    def __len__(self) -> int:
        return self.n

    def offsets(self, counter: str) -> np.ndarray:
        """The counter's offsets (B + 1), shared by its member fields."""
        return self.ragged[self.schema.members(counter)[0].name].offsets

    def lengths(self, counter: str) -> np.ndarray:
        return np.diff(self.offsets(counter))

    def event(self, k: int) -> dict[str, np.ndarray]:
        """Event k as ``ds[i]`` returns it."""
        out = {name: np.asarray(col[k]) for name, col in self.fixed.items()}
        out.update({name: r[k] for name, r in self.ragged.items()})
        return {f.name: out[f.name] for f in self.schema.fields}

    def to_chunk(self) -> EventChunk:
        columns = {**self.fixed, **{name: r.values for name, r in self.ragged.items()}}
        return EventChunk(first=0, n=self.n, columns=columns,
                          offsets={c: self.offsets(c) for c in self.schema.counters})

    @classmethod
    def from_samples(cls, samples: Sequence[dict[str, np.ndarray]], schema: EventSchema) -> EventBatch:
        """Events as ``ds[i]`` returns them, stacked (one concatenation per field)."""
        fixed = {f.name: np.stack([np.asarray(s[f.name], dtype=f.np_dtype) for s in samples]).reshape(
            len(samples), *f.shape) for f in schema.fixed}
        ragged: dict[str, Ragged] = {}
        for c in schema.counters:
            members = schema.members(c)
            offsets = starts_of(np.array([len(s[members[0].name]) for s in samples], dtype=np.int64))
            for f in members:
                parts = [np.asarray(s[f.name], dtype=f.np_dtype).reshape(-1, *f.shape) for s in samples]
                values = np.concatenate(parts) if parts else np.zeros((0, *f.shape), f.np_dtype)
                if len(values) != offsets[-1]:
                    raise ValueError(f"field {f.name!r}: lengths differ from the other fields of counter {c!r}")
                ragged[f.name] = Ragged(values, offsets)
        return cls(schema=schema, fixed=fixed, ragged=ragged, n=len(samples))


def _long_runs(counts: np.ndarray, item_bytes: int) -> bool:
    """Whether the events' values (of at least ``item_bytes`` each) are long enough to copy one slice
    per event and field."""
    return int(counts.sum()) * item_bytes >= RUN_BYTES * len(counts)


@dataclass(frozen=True, slots=True)
class Member:
    """A ragged field as a batch reads it, its numbers looked up once (``Field`` derives them per call)."""

    name: str
    item_bytes: int
    dtype: np.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, f: Field) -> Member:
        return cls(name=f.name, item_bytes=f.item_bytes, dtype=f.np_dtype, shape=f.shape)


def _join_runs(members: tuple[Member, ...], shards: dict[int, Any], shard_of: np.ndarray,
               first: np.ndarray, counts: np.ndarray) -> dict[str, np.ndarray]:
    """Each field of ``members`` for each event, in the requested order, one slice of its shard's
    memory map per event (several times faster than a numpy gather with one index per value, for
    events of hundreds of values). The byte ranges are made once per item size, and the slices are
    taken by ``map`` (no Python bytecode per event)."""
    spans: dict[int, list[slice]] = {}
    out = {}
    which = shard_of.tolist() if len(shards) > 1 else None
    with no_gc():
        for f in members:
            cut = spans.get(f.item_bytes)
            if cut is None:
                lo = first * f.item_bytes
                cut = spans[f.item_bytes] = list(map(slice, lo.tolist(), (lo + counts * f.item_bytes).tolist()))
            if which is None:
                pieces = map(next(iter(shards.values())).bytes_of(f.name).__getitem__, cut)
            else:
                views = {s: shard.bytes_of(f.name) for s, shard in shards.items()}
                pieces = map(getitem, map(views.__getitem__, which), cut)
            out[f.name] = join(pieces).view(f.dtype).reshape(-1, *f.shape)
    return out


def _join(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return recycle.concatenate(parts) if parts else np.zeros(empty_shape, dtype=dtype)
