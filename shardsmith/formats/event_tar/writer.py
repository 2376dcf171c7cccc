"""Physics events in webdataset tar shards: one ``.npy`` member per field (never pickled).

A sample is one event, or with ``events_per_sample`` N a window of N consecutive events (in the
shuffled order): fixed fields become ``(N, *shape)`` arrays, ragged fields their values back to
back plus ``{counter}.offsets.npy`` (int64, N+1). Samples are named by their position in the split,
``e0000000000`` for events 0…N-1 and so on, because the shuffle moves columns, not names.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema, decode
from shardsmith.core.ragged import starts_of
from shardsmith.formats.webdataset.tarfmt import BLOCK, sample_members
from shardsmith.formats.webdataset.writer import TarWriter
from shardsmith.kit.rollover import Rollover
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

if TYPE_CHECKING:
    from shardsmith.kit.batches import SortedBatch

_NPY_MAGIC = b"\x93NUMPY\x01\x00"


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` in the .npy format (version 1.0, C order), as ``np.save`` writes it, without a file object."""
    array = np.asarray(array)  # not ascontiguousarray: it makes 0-d arrays 1-d
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    return _npy_head(array.dtype, array.shape) + array.tobytes()


def _npy_head(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    header = f"{{'descr': {dtype.str!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    pad = -(len(_NPY_MAGIC) + 2 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    return _NPY_MAGIC + struct.pack("<H", len(header)) + header.encode("latin1")


def member_names(schema: EventSchema, events_per_sample: int) -> list[str]:
    """The member extensions of every sample, in order."""
    names = [f"{f.name}.npy" for f in schema.fields]
    if events_per_sample > 1:
        names += [f"{c}.offsets.npy" for c in schema.counters]
    return names


class EventTarWriter(Writer):
    """Decodes the shuffled event records and writes them as tar samples through a ``TarWriter``."""
    keeps_batches = False  # batches are decoded into new arrays

    name = "webdataset"
    suffix = ".tar"

    def __init__(self, *, out_dir: Path, split: str, schema: EventSchema, events_per_sample: int = 1,
                 shard_samples: int | None, shard_bytes: int, part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.schema = schema
        self.per_sample = events_per_sample
        self.tar = TarWriter(out_dir=out_dir, split=split, shard_samples=shard_samples, shard_bytes=shard_bytes,
                             part=part)
        self.events = self.part.first_sample  # samples are named by the position of their first event
        self._held: EventChunk | None = None  # events short of a full window, waiting for the next batch

    @property
    def weigh_payload(self) -> bool:
        return True  # a sample's tar bytes depend on its events' counts

    @property
    def rangeable(self) -> bool:
        # windows of several events are cut by position in the split, which a shard plan over
        # events does not follow yet: one writer makes them all
        return self.per_sample == 1

    def rollover(self) -> Rollover:
        return self.tar.rollover()

    def weights(self, lengths: np.ndarray, payload: memoryview | None) -> np.ndarray:
        """Each event's bytes as a one-event tar sample: a header and a padded .npy per field,
        from the counts in its record (only with one event per sample)."""
        assert payload is not None
        return self._weights(np.asarray(lengths, dtype=np.int64), payload, None)

    def sorted_weights(self, batch: SortedBatch) -> np.ndarray:
        return self._weights(batch.lengths, batch.source, batch.starts)

    def _weights(self, lengths: np.ndarray, payload: Any, starts: np.ndarray | None) -> np.ndarray:
        """Records back to back in ``payload``, or at ``starts`` in it."""
        assert self.per_sample == 1
        out = np.full(len(lengths), sum(_member_bytes(f, None) for f in self.schema.fixed), dtype=np.int64)
        if not self.schema.counters or not len(lengths):
            return out
        raw = np.frombuffer(payload, dtype=np.uint8)
        at = (starts_of(lengths)[:-1] if starts is None else starts) + sum(-(-f.item_bytes // 8) * 8
                                                                           for f in self.schema.fixed)
        for ci, c in enumerate(self.schema.counters):
            where = (at + 8 * ci)[:, None] + np.arange(8)
            counts = raw[where].copy().view("<i8").ravel()
            for f in self.schema.members(c):
                out += _member_bytes(f, counts)
        return out

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        self._append(decode(lengths, payload, self.schema))

    def write_sorted(self, batch: SortedBatch) -> None:
        self._append(decode(batch.lengths, batch.source, self.schema, starts=batch.starts))

    def _append(self, chunk: EventChunk) -> None:
        if self._held is not None:
            chunk = _concat(self._held, chunk, self.schema)
            self._held = None
        full = chunk.n - chunk.n % self.per_sample
        if full < chunk.n:
            self._held = chunk.take(np.arange(full, chunk.n), self.schema)
        self._write(chunk, full)

    def _write(self, chunk: EventChunk, n: int) -> None:
        pieces: list[bytes | memoryview] = []
        sizes: list[int] = []
        per = self.per_sample
        for a in range(0, n, per):
            fields = self._sample(chunk, a, min(a + per, n))
            members = sample_members(f"e{self.events:010d}", fields)
            pieces += members
            sizes.append(sum(len(m) for m in members))
            self.events += min(per, n - a)
        if sizes:
            self.tar.write_batch(np.asarray(sizes, dtype=np.int64), memoryview(b"".join(pieces)))

    def _sample(self, chunk: EventChunk, a: int, b: int) -> list[tuple[str, bytes]]:
        out = []
        one = self.per_sample == 1
        for f in self.schema.fields:
            col = chunk.columns[f.name]
            if f.ragged:
                off = chunk.offsets[f.counter]
                value = col[off[a]:off[b]]
            else:
                value = col[a] if one else col[a:b]
            out.append((f"{f.name}.npy", npy_bytes(value)))
        if not one:
            for c in self.schema.counters:
                off = chunk.offsets[c]
                out.append((f"{c}.offsets.npy", npy_bytes(off[a:b + 1] - off[a])))
        return out

    def close(self) -> list[ShardRecord]:
        if self._held is not None and self._held.n:
            self._write(self._held, self._held.n)  # the last window may be short
            self._held = None
        self.shards = self.tar.close()
        self.md5s = self.tar.md5s
        return self.shards

    def piece(self) -> dict[str, Any]:
        return {**super().piece(), "events": self.events - self.part.first_sample}

    @property
    def shards_alone(self) -> bool:
        return self.rangeable  # one event a sample: a shard's events are its samples

    def shard_full(self) -> None:
        if self._held is None:  # one event a sample (a planned split): no window waits
            self.tar.shard_full()

    def settle(self) -> None:
        """The tar writer's shards finished by now, counted here too (the gather records them one by one)."""
        self.tar.settle()
        self.shards, self.md5s = list(self.tar.shards), list(self.tar.md5s)

    def shard_piece(self, i: int) -> dict[str, Any] | None:
        """One finished shard alone, with its events, so the gather gives back the spill it read."""
        piece = self.tar.shard_piece(i) if self.shards_alone else None
        return None if piece is None else {**piece, "events": self.shards[i].samples}

    def finish_split(self, pieces: list[dict[str, Any]]) -> dict[str, Any]:
        self.tar.finish_split(pieces)
        return {"events": sum(int(p["events"]) for p in pieces)}

    def abort(self) -> None:
        self.tar.abort()


def _npy_prefix(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """Bytes of a .npy file before its data (``npy_bytes``' magic, length and padded header)."""
    return len(_npy_head(dtype, shape))


def _member_bytes(field: Any, counts: np.ndarray | None) -> Any:
    """Tar bytes of a field's member in one-event samples: header, .npy prefix and data, padded;
    for a ragged field, per event from its counts (the prefix grows with the count's digits)."""
    dtype, inner = field.np_dtype, tuple(field.shape)
    if counts is None:
        return BLOCK + _pad512(_npy_prefix(dtype, inner) + field.item_bytes)
    digits = np.char.str_len(counts.astype("U20"))
    prefix = np.zeros(len(counts), dtype=np.int64)
    for d in np.unique(digits).tolist():
        prefix[digits == d] = _npy_prefix(dtype, (10 ** (d - 1), *inner))
    return BLOCK + _pad512(prefix + counts * field.item_bytes)


def _pad512(n: Any) -> Any:
    return -(-n // BLOCK) * BLOCK


def _concat(a: EventChunk, b: EventChunk, schema: EventSchema) -> EventChunk:
    columns = {f.name: np.concatenate([a.columns[f.name], b.columns[f.name]]) for f in schema.fields}
    offsets = {c: np.concatenate([a.offsets[c], b.offsets[c][1:] + a.offsets[c][-1]]) for c in schema.counters}
    return EventChunk(first=a.first, n=a.n + b.n, columns=columns, offsets=offsets)
