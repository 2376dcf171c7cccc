"""Event shards ``{split}-{000000}.h5``: fixed fields as datasets, ragged fields as values + offsets.

Layout of one shard of ``n`` events (readable with h5py alone; the root attributes describe it)::

    /{fixed}                 (n, *shape)       one row per event
    /{ragged}/values         (total, *shape)   every event's values back to back
    /{ragged}/offsets        (n + 1,) int64    event i is values[offsets[i]:offsets[i + 1]]
    /_counters/{counter}     (n + 1,) int64    stored once; each member's ``offsets`` is a hard link to it

Root attributes: ``format`` ("shardsmith-events"), ``format_version``, ``shardsmith_version``,
``schema`` (JSON of ``EventSchema.to_json()``), ``counters`` (JSON: counter -> member fields),
``samples`` and ``layout`` (the lines above, for a reader without shardsmith).

Uncompressed datasets are contiguous (and page-aligned from 64 KiB), so the loader memory-maps them (a random
batch is then a numpy gather, not one HDF5 call per event); compressed ones are chunked in
~128 KiB pieces, the size of a window of a few hundred events. ``libver`` is pinned to
v1.8 .. v1.14 so HDF5 1.14 reads what HDF5 2.x writes. A shard is written under a temporary
name and renamed when whole.

How a shard is written: the gather hands sorted batches whose records lie in the part files'
mapped pages (``Writer.maps_parts``); fixed fields and offsets are decoded at once, ragged values
are left there (``core.ragged.Runs``). h5py lays out a *skeleton* file (metadata, compressed chunks,
and the space of every contiguous dataset allocated but never written: a sparse hole). On a thread,
while the next shard's batches are decoded, the shard is then streamed front to back from the
skeleton's bytes between the datasets, the decoded columns and the ragged values copied from the
part files' pages straight into ``HashingFile``'s batch buffers: hashed while written, with
``O_DIRECT``. The ragged values are copied once in the gather, never into fresh memory first
(decoding them into new arrays cost more than writing the shard: the first touch of fresh pages;
gather 1.6-2.1 s -> 1.2 s on 100k bench events under load). Writing through the page cache cost more than the
rest of the gather on these VMs (the first touch of each fresh page-cache page; 258 MB/s with
fdatasync against 720-900 MB/s direct), and hashing no longer re-reads the shard. (Building it in
memory with HDF5's ``core`` driver was measured 2-4x slower: one more shard-sized copy.)

How the events get here, every byte copied as few times as the exact shuffle allows: the scatter
hands each event's record to its part file as the buffers that make it up
(``events.record_pieces``; ``PartWriter.add`` writes the list with ``writelines``; records under
1 KB on average are still joined: a Python object per few bytes costs more), and the gather maps
the groups (``shuffle.map_group``, read only; above 512 part files it reads groups as before, a
mapped file holding a descriptor) and lets the pages go as it goes (``engine/shuffle/mapped.py``); once a
shard's values are copied its commit lets the maps go too (``pages.let_go_views``: the pages the
copy faulted in again; never anonymous memory). Memory stays the decoded fixed fields of about one
shard, the values being reclaimable page cache. The parent imports h5py while the scatter workers
work (``Writer.preload``), so the forked gather workers do not each import it.
"""

from __future__ import annotations

import contextlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardsmith.core import pages
from shardsmith.core.events import EventChunk, EventSchema, decode, decode_from, decode_heads
from shardsmith.core.fsutil import HashingFile, _tmp, fsync_dir, naming
from shardsmith.core.ragged import Runs
from shardsmith.core.version import __version__
from shardsmith.formats.hdf5.settings import COUNTERS_GROUP, check_compression, check_names, libver
from shardsmith.kit.rollover import Rollover, runs
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

if TYPE_CHECKING:
    from shardsmith.kit.batches import MappedBatch, SortedBatch

FORMAT = "shardsmith-events"
FORMAT_VERSION = 1
CHUNK_BYTES = 128 << 10
ALIGN_THRESHOLD, ALIGN_INTERVAL = 64 << 10, 4096
BATCH_BYTES = 8 << 20  # HashingFile batches: O_DIRECT writes of whole blocks, buffers reused
LAYOUT = (
    "fixed field: dataset /{name} of shape (n, *shape); "
    "ragged field: group /{name} with values (total, *shape) and offsets (n+1, int64); "
    "event i of a ragged field is values[offsets[i]:offsets[i+1]]; "
    "fields of one counter share one offsets dataset, /_counters/{counter}, hard-linked into each group"
)


class HDF5Writer(Writer):
    """Rolls event shards over at ``shard_samples`` events or ``shard_bytes`` (uncompressed) bytes.

    Batches are kept until the shard is full (fixed fields and offsets decoded; ragged values in
    the part files' pages, or in the caller's arrays for ``write_batch``), then streamed in one
    pass per field (memory: about one shard of decoded fixed fields; the values are page cache).
    """

    name = "hdf5"
    keeps_batches = True  # ragged values stay in the batches' payloads until the shard is written
    maps_parts = True  # ... the part files' pages, mapped: copied once, into the shard
    suffix = ".h5"

    def __init__(self, *, out_dir: Path, split: str, schema: EventSchema, shard_samples: int | None,
                 shard_bytes: int, compression: str = "none", part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.schema = schema
        self.shard_samples = shard_samples
        self.shard_bytes = shard_bytes
        self.compression = compression
        self._filters = check_compression(compression)
        check_names(schema)
        self._roller = self.rollover()
        # events in output order: fixed columns and offsets decoded, ragged values as arrays or as
        # ``Runs`` of the sorted batches' payloads (copied once, when the shard is streamed)
        self._pending: list[tuple[EventChunk, dict[str, Any]]] = []
        self._n = 0
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future[ShardRecord]] = []

    def preload(self) -> None:
        libver()  # imports h5py

    # -- rollover -------------------------------------------------------------------------------

    def rollover(self) -> Rollover:
        """Shards hold at most ``shard_bytes`` of event records (values, counts, 8-byte alignment:
        about the uncompressed size) and ``shard_samples`` events."""
        return Rollover(max_weight=self.shard_bytes, max_samples=self.shard_samples)

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        """Append encoded events (``shardsmith.core.events.encode`` records) in output order."""
        if len(lengths):  # the caller may reuse ``payload``: decoded into new arrays
            chunk = decode(lengths, payload, self.schema)
            self._append(chunk, {f.name: chunk.columns[f.name] for f in self.schema.ragged}, lengths)

    def write_sorted(self, batch: SortedBatch) -> None:
        """Fixed fields and offsets decoded now; ragged values left in the batch's payload (the
        gather never reuses it: ``keeps_batches``) until ``_commit`` copies them into the shard."""
        if len(batch.lengths):
            chunk, values = decode_heads(batch.lengths, batch.source, self.schema, starts=batch.starts)
            self._append(chunk, values, batch.lengths)

    def write_mapped(self, batch: MappedBatch) -> None:
        """``write_sorted`` of a batch whose payloads lie in the part files' mapped pages."""
        if len(batch.lengths):
            chunk, values = decode_from(batch.sources, batch.src, batch.starts, batch.lengths, self.schema)
            self._append(chunk, values, batch.lengths)

    def _append(self, chunk: EventChunk, values: dict[str, Any], lengths: np.ndarray) -> None:
        for a, b, new in runs(self._roller.cut(self.weights(lengths, None)), chunk.n):
            if new:
                self._roll()
            self._pending.append(_slice(chunk, values, a, b, self.schema))
            self._n += b - a

    def shard_full(self) -> None:
        if self._n:
            self._roll()
        self._roller = self.rollover()  # an empty shard: the next sample opens one

    def close(self) -> list[ShardRecord]:
        if self._n:
            self._roll()
        self._drain(0)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        return self.shards

    def abort(self) -> None:
        """Drop the shard being built and every temporary file."""
        self._pending, self._n = [], 0
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for index in range(self.next_index(), self.next_index() + len(self._futures) + 1):
            for tmp in (_tmp(self.out_dir / self.shard_name(index)), _skeleton(self.out_dir / self.shard_name(index))):
                with contextlib.suppress(OSError):
                    tmp.unlink()
        self._futures = []

    # -- one shard ------------------------------------------------------------------------------

    def _roll(self) -> None:
        """Lay out the pending events' shard; stream, hash, fsync and rename it on a thread."""
        path = self.out_dir / self.shard_name(self.next_index() + len(self._futures))
        skeleton = _skeleton(path)
        try:
            with naming(path):  # h5py's errors for a full disk name no file
                regions = self._build(skeleton)
        except BaseException:
            with contextlib.suppress(OSError):
                skeleton.unlink()
            raise
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"hdf5 {self.split}")
        self._drain(1)  # one shard finishing at a time: bounded work in flight
        self._futures.append(self._pool.submit(_commit, skeleton, path, regions, self._n, self.compression))
        self._pending, self._n = [], 0

    def settle(self) -> None:
        """Take the shards whose commit has finished (no waiting): the gather records each one and
        gives back the spill it read as soon as it is whole (``engine/shuffle/release.py``)."""
        while self._futures and self._futures[0].done():
            self.shards.append(self._futures.pop(0).result())

    def _drain(self, keep: int) -> None:
        """Wait for finishing shards until at most ``keep`` are in flight; records stay in order."""
        while len(self._futures) > keep:
            self.shards.append(self._futures.pop(0).result())

    def _build(self, path: Path) -> list[tuple[int, list[np.ndarray]]]:
        """The shard's skeleton from the pending columns: h5py lays out the file and writes the
        compressed datasets; contiguous (uncompressed) datasets are allocated when created and left
        unwritten. Returns their (file offset, columns back to back), the bytes ``_commit`` puts
        there."""
        import h5py

        schema, pieces, n = self.schema, self._pending, self._n
        raw: list[tuple[int, list[np.ndarray]]] = []
        with h5py.File(path, "w", libver=libver(), locking=False, alignment_threshold=ALIGN_THRESHOLD,
                       alignment_interval=ALIGN_INTERVAL) as f:
            counters = {c: [m.name for m in schema.members(c)] for c in schema.counters}
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["shardsmith_version"] = __version__
            f.attrs["schema"] = json.dumps(schema.to_json())
            f.attrs["counters"] = json.dumps(counters)
            f.attrs["samples"] = np.int64(n)
            f.attrs["layout"] = LAYOUT
            # the dataset of each kind being written: closed (its chunks placed) once the next is laid out
            ds = shared = None
            for field in schema.fixed:
                ds = _close_previous(ds, self._dataset(f, field.name, (n, *field.shape), field.np_dtype))
                self._fill(ds, [p.columns[field.name] for p, _ in pieces], raw)
            group = f.create_group(COUNTERS_GROUP) if counters else None
            for c in schema.counters:
                offsets = _join_offsets([p.offsets[c] for p, _ in pieces])
                shared = _close_previous(shared, self._dataset(group, c, offsets.shape, np.dtype(np.int64)))
                self._fill(shared, [offsets], raw)
                shared.attrs["members"] = json.dumps(counters[c])
                for field in schema.members(c):
                    g = f.create_group(field.name)
                    g.attrs["counter"] = c
                    g["offsets"] = shared  # a hard link: one array, several names
                    values_shape = (int(offsets[-1]), *field.shape)
                    ds = _close_previous(ds, self._dataset(g, "values", values_shape, field.np_dtype))
                    self._fill(ds, [values[field.name] for _, values in pieces], raw, field)
            for last in (shared, ds):
                _close_previous(last, None)
        return sorted(raw, key=lambda r: r[0])

    def _dataset(self, parent: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        import h5py

        if not self._filters or shape[0] == 0:
            # contiguous, its space allocated now (so its offset is known) and never filled with
            # zeros first: every byte is written by ``_build``
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_obj_track_times(False)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            space = h5py.h5s.create_simple(shape)
            tid = h5py.h5t.py_create(dtype, logical=True)
            lcpl = None
            if not name.isascii():  # as h5py names links
                lcpl = h5py.h5p.create(h5py.h5p.LINK_CREATE)
                lcpl.set_char_encoding(h5py.h5t.CSET_UTF8)
            return h5py.Dataset(h5py.h5d.create(parent.id, name.encode(), tid, space, dcpl=dcpl, lcpl=lcpl))
        row = max(1, dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64)))
        chunks = (min(shape[0], max(1, CHUNK_BYTES // row)), *shape[1:])
        return parent.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, track_times=False,
                                     **self._filters)

    @staticmethod
    def _fill(ds: Any, columns: list[Any], raw: list[tuple[int, list[Any]]], field: Any = None) -> None:
        """Columns (arrays, or ``Runs`` of ``field``'s values) back to back into a dataset: through
        h5py if chunked, else noted for ``_commit``."""
        offset = ds.id.get_offset() if ds.chunks is None else None
        if offset is not None:
            raw.append((offset, [c for c in columns if len(c)]))
            return
        at = 0
        for col in columns:
            if isinstance(col, Runs):
                col = col.joined().view(field.np_dtype).reshape(-1, *field.shape)
            if len(col):
                ds[at:at + len(col)] = col
                at += len(col)


def _close_previous(previous: Any, laid_out: Any) -> Any:
    """Close ``previous`` (a dataset, or None) now that ``laid_out`` exists; returns ``laid_out``.

    Closing a chunked dataset writes the compressed chunks still in its chunk cache, and HDF5 gives
    them their file space then: the order in which datasets close is the order of those chunks in
    the file. Left to Python, a dataset closes when its last reference goes, and a reference can
    outlive the code that made it: a sampling profiler that holds a frame of this writer (a Dask
    worker samples its task's stack every 10 ms) closed datasets later, from its own thread or at
    the file's close, and the same data made other bytes. Closed here, explicitly, at the points
    where the last reference went before (the next dataset of the same kind laid out; the last
    ones before the file closes), whoever still holds them: the layout is a function of the data.
    """
    if previous is not None:
        previous.id.close()
    return laid_out


def _skeleton(path: Path) -> Path:
    """The temporary name of a shard's h5py-written skeleton."""
    return _tmp(path.with_name(path.name + ".layout"))


def _commit(skeleton: Path, path: Path, regions: list[tuple[int, list[np.ndarray]]], samples: int,
            compression: str) -> ShardRecord:
    """Stream the shard front to back (skeleton bytes between the contiguous datasets, columns
    in them), hashed and written directly to the disk; fsync and rename it."""
    out: HashingFile | None = None
    try:
        with naming(path), open(skeleton, "rb", buffering=0) as src:
            out = HashingFile(path, batch_bytes=BATCH_BYTES)
            size = os.fstat(src.fileno()).st_size
            at = 0
            for offset, columns in regions:
                _copy_range(src, at, offset, out)
                for col in columns:
                    if isinstance(col, Runs):  # copied here, into the batch it is written from
                        col.write_to(out.reserve, BATCH_BYTES)
                        offset += col.total
                        continue
                    view = memoryview(np.ascontiguousarray(col)).cast("B")
                    out.write(view)
                    offset += len(view)
                at = offset
            if at > size:
                raise OSError(f"{skeleton}: the datasets end at byte {at}, past the file's {size} bytes")
            _copy_range(src, at, size, out)
        # the part files' pages this shard's values were copied from: out of the resident set now (the
        # gather's bound on them counts the pages it maps, not those this copy faulted in again)
        pages.let_go_views([s for _, columns in regions for c in columns if isinstance(c, Runs) for s in c.sources])
        sha = out.commit()
    except BaseException:
        if out is not None:
            out.abort()
        raise
    finally:
        with contextlib.suppress(OSError):
            skeleton.unlink()
    fsync_dir(path.parent)
    return ShardRecord(path=path.name, samples=samples, bytes=size, sha256=sha, extra={"compression": compression})


def _copy_range(src: Any, start: int, stop: int, out: HashingFile) -> None:
    """Bytes ``[start, stop)`` of the skeleton into the shard (metadata, compressed chunks)."""
    while start < stop:
        data = os.pread(src.fileno(), min(stop - start, 8 << 20), start)
        if not data:
            raise OSError(f"{src.name}: ends at byte {start}, before {stop}")
        out.write(data)
        start += len(data)


def _slice(chunk: EventChunk, values: dict[str, Any], a: int, b: int, schema: EventSchema
           ) -> tuple[EventChunk, dict[str, Any]]:
    """Events ``[a, b)`` of a chunk and of its ragged values (arrays or ``Runs``), as views (no copy)."""
    if a == 0 and b == chunk.n:
        return chunk, values
    columns = {f.name: chunk.columns[f.name][a:b] for f in schema.fixed}
    offsets, ragged = {}, {}
    for c in schema.counters:
        off = chunk.offsets[c]
        lo, hi = int(off[a]), int(off[b])
        offsets[c] = off[a:b + 1] - lo
        for f in schema.members(c):
            v = values[f.name]
            ragged[f.name] = v[a:b] if isinstance(v, Runs) else v[lo:hi]
    return EventChunk(first=chunk.first + a, n=b - a, columns=columns, offsets=offsets), ragged


def _join_offsets(parts: list[np.ndarray]) -> np.ndarray:
    """Offsets of chunks back to back, as one array starting at 0."""
    out = np.zeros(sum(len(p) - 1 for p in parts) + 1, dtype=np.int64)
    at, base = 0, 0
    for p in parts:
        out[at + 1:at + len(p)] = p[1:] + base
        at += len(p) - 1
        base += int(p[-1])
    return out


