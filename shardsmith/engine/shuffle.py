"""The keyed external shuffle: scatter samples into key-range buckets on disk, then sort bucket by bucket.

Scatter: every task writes one *part file* holding, per (split, bucket), the samples' keys,
tie-breakers (input order), payload lengths and payloads. A bucket is a range of the top bits of
the key, so bucket b's samples all sort before bucket b+1's. Gather: for each split, read the
buckets in order (several small ones at a time, up to the memory budget), sort by (key, input
order) and hand the payloads on in that order. The bytes depend only on the samples' identities
and the seed, never on how many workers or machines wrote the parts: the parts are plain files,
so scatter and gather can run on different machines over a shared folder.

Without shuffling the key is the input order itself and each task is its own bucket.

How many buckets: a power of two, enough that one holds at most a quarter of the gather's group
budget (``Sizing.group_bytes``: min(``--memory`` / 6, 64 MB)), by the payload bytes the job
estimates (``JobSteps.estimated_bytes``: the inputs' size; for events the selected fields' decoded
bytes from the inputs' metadata, ``Reader.decoded_bytes``, else 4x the inputs). Every part records
its bucket count, and a part cut into another count is redone. A writer that copies each payload
once into its output reads a group's payloads in the part files' mapped pages instead
(``engine/mapped.py``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from shardsmith.core.fsutil import naming
from shardsmith.core.ragged import starts_of
from shardsmith.errors import DatasetError
from shardsmith.kit.batches import Segment, SortedBatch
from shardsmith.kit.keys import output_order

PART_MAGIC = b"SSPART01"
_PIECE_BYTES = 200  # a memoryview object and its list slot
_TRAILER = struct.Struct("<Q8s")


@dataclass(slots=True)
class _Run:
    keys: list[np.ndarray] = field(default_factory=list)
    order: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    payload: list[bytes | memoryview] = field(default_factory=list)
    nbytes: int = 0


def bucket_count(estimated_bytes: int, memory: int) -> int:
    """Enough key-range buckets that one bucket is a small fraction of the memory budget."""
    want = max(1, -(-4 * estimated_bytes // max(memory, 1)))
    return min(1 << 16, 1 << (want - 1).bit_length())


def bucket_of(keys: np.ndarray, n_buckets: int) -> np.ndarray:
    """The bucket of each key: its top log2(n_buckets) bits."""
    bits = n_buckets.bit_length() - 1
    if bits == 0:
        return np.zeros(len(keys), dtype=np.int64)
    return (keys >> np.uint64(64 - bits)).astype(np.int64)


class PartWriter:
    """Collects one task's samples by (split, bucket) and writes them as one part file.

    Beyond ``flush_bytes`` of buffered payload, the runs so far go to the (temporary) part file
    as segments and memory is freed: a task as large as a whole 20 GB .jsonl.zst never holds more
    than that. A (split, bucket) may then have several segments in one part; the gather sorts them
    together anyway.
    """

    def __init__(self, path: Path, *, flush_bytes: int = 64 << 20) -> None:
        self.path = Path(path)
        self.flush_bytes = flush_bytes
        self._runs: dict[tuple[int, int], _Run] = {}
        self._buffered = 0
        self._segments: list[list[int]] = []
        self._offset = 0
        self._tmp = self.path.with_name(f".{self.path.name}.tmp-{os.uname().nodename}-{os.getpid()}")
        self._fh: Any = None

    def add(
        self, *, split: int, bucket: int, keys: np.ndarray, order: np.ndarray, lengths: np.ndarray,
        payload: bytes | memoryview | list[Any],
    ) -> None:
        """Samples with their payloads back to back: one buffer, or a list of buffers that make
        them up (written as they are: no joined copy). Buffers of bytes: ``bytes``, or memoryviews
        of format "B" (``len`` counts their bytes)."""
        run = self._runs.setdefault((split, bucket), _Run())
        run.keys.append(keys.astype(np.uint64, copy=False))
        run.order.append(order.astype(np.uint64, copy=False))
        run.lengths.append(lengths.astype(np.uint64, copy=False))
        held = 0
        if isinstance(payload, list):
            size = int(lengths.sum())
            run.payload.extend(payload)
            held = _PIECE_BYTES * len(payload)  # each piece is a Python object: counted against flush_bytes
        else:
            size = len(payload)
            run.payload.append(payload)
        run.nbytes += size
        self._buffered += size + 24 * len(keys) + held
        if self._buffered >= self.flush_bytes:
            self._flush()

    def _flush(self) -> None:
        """Write the buffered runs as segments and forget them."""
        with naming(self.path):
            self._write_runs()

    def _write_runs(self) -> None:
        if self._fh is None:
            # unbuffered: payloads may come as many small pieces (``add``), which go to the kernel as
            # they are, many to a call (``_write_all``), not copied into a buffer first
            self._fh = open(self._tmp, "wb", buffering=0)  # noqa: SIM115 (closed in write/abort)
        buffers: list[Any] = []
        for (split, bucket), run in sorted(self._runs.items()):
            arrays = [np.concatenate(a) for a in (run.keys, run.order, run.lengths)]
            count = len(arrays[0])
            self._segments.append([split, bucket, self._offset, count, run.nbytes])
            buffers += [memoryview(a).cast("B") for a in arrays]
            buffers += run.payload
            self._offset += 24 * count + run.nbytes
        _write_all(self._fh.fileno(), buffers)
        self._runs.clear()
        self._buffered = 0

    def write(self, meta: dict) -> None:
        """Finish the part: the last segments, a JSON footer that names them all, a trailer; then
        rename it into place. Not fsynced: parts are scratch, as large as the dataset, and read
        back at once; fsyncing them would make the disk take the whole dataset once more before
        the run may end (measured 15.7 -> 20.2 s on 500k ROOT events). A killed process leaves its
        renamed parts whole in the page cache; after a power loss a part cut short fails its
        trailer check and is redone."""
        try:
            self._flush()
            footer = orjson.dumps({"meta": meta, "segments": self._segments})
            with naming(self.path):
                _write_all(self._fh.fileno(), [footer, _TRAILER.pack(len(footer), PART_MAGIC)])
                self._fh.close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):  # closing flushes: on a full disk that fails again
                self._fh.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()


def _write_all(fd: int, buffers: list[Any]) -> None:
    """Byte buffers one after another, ``_IOV_MAX`` to a system call: the kernel copies each piece
    once (a buffered ``writelines`` copied it into its buffer first, at a call per piece; 500k ROOT
    events, --stage scatter --workers 2: 4.61 -> 4.50 s). A write the kernel takes only in part
    goes on from where it stopped."""
    i = 0
    while i < len(buffers):
        chunk = buffers[i:i + _IOV_MAX]
        done = os.writev(fd, chunk)
        if done == sum(map(len, chunk)):  # len counts bytes: ``add`` takes byte buffers
            i += len(chunk)
            continue
        if done == 0:
            raise OSError(errno.EIO, "the file system took none of a write")
        while done >= memoryview(buffers[i]).nbytes:
            done -= memoryview(buffers[i]).nbytes
            i += 1
        buffers[i] = memoryview(buffers[i]).cast("B")[done:]


_IOV_MAX = 1024  # buffers per writev: Linux's limit


def read_part_footer(path: Path) -> dict:
    """The footer of a finished part file; a part without a valid trailer is not finished."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if size < _TRAILER.size:
            raise DatasetError(f"{path}: truncated part file")
        fh.seek(size - _TRAILER.size)
        length, magic = _TRAILER.unpack(fh.read(_TRAILER.size))
        if magic != PART_MAGIC or length > size - _TRAILER.size:
            raise DatasetError(f"{path}: not a shardsmith part file")
        fh.seek(size - _TRAILER.size - length)
        return orjson.loads(fh.read(length))


def segments_by_split(parts: list[tuple[Path, dict]], n_splits: int) -> list[dict[int, list[Segment]]]:
    """Per split, bucket → its segments in part order."""
    table: list[dict[int, list[Segment]]] = [{} for _ in range(n_splits)]
    for path, footer in parts:
        for split, bucket, offset, count, payload_bytes in footer["segments"]:
            table[split].setdefault(bucket, []).append(Segment(str(path), offset, count, payload_bytes))
    return table


def _group(buckets: dict[int, list[Segment]], budget: int) -> Iterator[tuple[list[int], list[Segment]]]:
    """Consecutive buckets merged until a group reaches the budget (they stay in key order): each
    group's buckets and their segments."""
    group: list[Segment] = []
    ids: list[int] = []
    size = 0
    for bucket in sorted(buckets):
        segs = buckets[bucket]
        seg_bytes = sum(s.nbytes for s in segs)
        if group and size + seg_bytes > budget:
            yield ids, group
            group, ids, size = [], [], 0
        group.extend(segs)
        ids.append(bucket)
        size += seg_bytes
    if group:
        yield ids, group


class LoadBuffer:
    """One payload buffer reused for every group a gather reads, for a writer that is done with a
    batch when ``write_sorted`` returns: pages touched once, not a fresh allocation per group
    (whose first touch costs more than the read on these VMs)."""

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)

    def take(self, n: int) -> np.ndarray:
        if len(self._buf) < n:
            self._buf = np.empty(0, dtype=np.uint8)  # the old pages go before the new ones come
            self._buf = np.empty(n + n // 8, dtype=np.uint8)
        return self._buf[:n]


def _load_group(group: list[Segment], *, payloads: bool = True, into: LoadBuffer | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Keys, input order, lengths and (unless ``payloads`` is False) payloads of a group, read
    straight into one payload buffer (``into``'s, when given)."""
    heads = np.empty((3, sum(s.count for s in group)), dtype=np.uint64)
    size = sum(s.payload_bytes for s in group)
    payload = (np.empty(size, dtype=np.uint8) if into is None else into.take(size)) if payloads else None
    row = pos = 0
    handles: dict[str, Any] = {}
    try:
        for seg in group:
            fh = handles.get(seg.path) or handles.setdefault(seg.path, open(seg.path, "rb"))  # noqa: SIM115
            fh.seek(seg.offset)
            head = np.empty((3, seg.count), dtype=np.uint64)
            got, want = fh.readinto(memoryview(head).cast("B")), 24 * seg.count
            if payload is not None:
                got += fh.readinto(payload[pos:pos + seg.payload_bytes])
                want += seg.payload_bytes
            if got != want:
                raise DatasetError(f"{seg.path}: part file shorter than its footer says")
            heads[:, row:row + seg.count] = head
            row += seg.count
            pos += seg.payload_bytes
    finally:
        for fh in handles.values():
            fh.close()
    return heads[0], heads[1], heads[2].astype(np.int64), payload


def groups(buckets: dict[int, list[Segment]], *, budget: int) -> list[tuple[list[int], list[Segment]]]:
    """A split's bucket groups in key order (each: its buckets, their segments): read, sorted and
    handed on one at a time."""
    return list(_group(buckets, budget))


Origins = Callable[[np.ndarray], np.ndarray]  # input orders -> their documents' origins (--provenance)


def in_output_order(keys: np.ndarray, order: np.ndarray, drop: np.ndarray | None = None) -> np.ndarray:
    """The rows of a group's samples in output order, leaving out those whose input order is in
    ``drop`` (sorted: the documents a dedup rule removed, ``engine/duplicates.py``)."""
    if drop is None or not len(drop):
        return output_order(keys, order)
    at = np.searchsorted(drop, order).clip(max=len(drop) - 1)
    kept = np.flatnonzero(drop[at] != order)
    return kept[output_order(keys[kept], order[kept])]


def sort_group(group: list[Segment], lo: int = 0, hi: int | None = None, *, into: LoadBuffer | None = None,
               drop: np.ndarray | None = None, origins: Origins | None = None) -> SortedBatch:
    """A group's samples in (key, input order) order, less those in ``drop``; only those at sorted
    positions ``[lo, hi)`` are handed on (a gather range that starts or ends inside the group). With
    ``into`` the payload lives in that buffer until the next group is read into it; ``origins``
    gives the batch its documents' origins."""
    keys, order, lengths, payload = _load_group(group, into=into)
    assert payload is not None
    rows = in_output_order(keys, order, drop)[lo:hi]
    return SortedBatch(lengths=lengths[rows], source=payload, starts=starts_of(lengths)[rows],
                       origins=None if origins is None else origins(order[rows]))


def sorted_lengths(group: list[Segment], drop: np.ndarray | None = None) -> np.ndarray:
    """A group's payload lengths in output order (less ``drop``), from the segments' heads alone
    (no payload read)."""
    keys, order, lengths, _ = _load_group(group, payloads=False)
    return lengths[in_output_order(keys, order, drop)]


def sorted_batches(buckets: dict[int, list[Segment]], *, budget: int) -> Iterator[SortedBatch]:
    """The samples of one split in (key, input order) order, a bucket group at a time."""
    for _, group in _group(buckets, budget):
        yield sort_group(group)
