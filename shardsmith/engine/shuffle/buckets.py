"""The keyed external shuffle: scatter samples into key-range buckets on disk, then sort bucket by bucket.

Scatter: every task writes one *part file* holding, per (split, bucket), the samples' keys,
tie-breakers (input order), payload lengths and payloads (``engine/shuffle/partfile.py``: its layout, written
and read; ``engine/shuffle/segments.py``: the gather's tables of its segments). A bucket is a range of the top bits of
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
(``engine/shuffle/mapped.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shardsmith.core.ragged import starts_of
from shardsmith.engine.shuffle.open_parts import OpenParts
from shardsmith.engine.shuffle.partfile import HEAD_BYTES
from shardsmith.engine.shuffle.segments import Segments
from shardsmith.errors import DatasetError
from shardsmith.kit.batches import SortedBatch
from shardsmith.kit.keys import output_order


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


def _load_group(group: Segments, *, parts: OpenParts, payloads: bool = True, into: LoadBuffer | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Keys, input order and lengths and (unless ``payloads`` is False) payloads of a group, read
    straight into one payload buffer (``into``'s, when given), a call per segment, from part files
    kept open by the reader (``parts``: each opened once for every group it reads)."""
    heads = np.empty((3, group.samples), dtype=np.uint64)
    size = group.payload_bytes
    payload = (np.empty(size, dtype=np.uint8) if into is None else into.take(size)) if payloads else None
    row = pos = 0
    for path, offset, count, payload_bytes in group.rows():
        head = np.empty((3, count), dtype=np.uint64)
        buffers: list[Any] = [memoryview(head).cast("B")]
        if payload is not None:
            buffers.append(payload[pos:pos + payload_bytes])
        want = HEAD_BYTES * count + (payload_bytes if payload is not None else 0)
        if parts.read_into(path, buffers, offset) != want:
            raise DatasetError(f"{path}: part file shorter than its footer says")
        heads[:, row:row + count] = head
        row += count
        pos += payload_bytes
    return heads[0], heads[1], heads[2].astype(np.int64), payload


Origins = Callable[[np.ndarray], np.ndarray]  # input orders -> their documents' origins (--provenance)


def in_output_order(keys: np.ndarray, order: np.ndarray, drop: np.ndarray | None = None) -> np.ndarray:
    """The rows of a group's samples in output order, leaving out those whose input order is in
    ``drop`` (sorted: the documents a dedup rule removed, ``engine/shuffle/duplicates.py``)."""
    if drop is None or not len(drop):
        return output_order(keys, order)
    at = np.searchsorted(drop, order).clip(max=len(drop) - 1)
    kept = np.flatnonzero(drop[at] != order)
    return kept[output_order(keys[kept], order[kept])]


def sort_group(group: Segments, lo: int = 0, hi: int | None = None, *, parts: OpenParts,
               into: LoadBuffer | None = None, drop: np.ndarray | None = None, origins: Origins | None = None
               ) -> SortedBatch:
    """A group's samples in (key, input order) order, less those in ``drop``; only those at sorted
    positions ``[lo, hi)`` are handed on (a gather range that starts or ends inside the group). With
    ``into`` the payload lives in that buffer until the next group is read into it; ``origins``
    gives the batch its documents' origins."""
    keys, order, lengths, payload = _load_group(group, parts=parts, into=into)
    assert payload is not None
    rows = in_output_order(keys, order, drop)[lo:hi]
    return SortedBatch(lengths=lengths[rows], source=payload, starts=starts_of(lengths)[rows],
                       origins=None if origins is None else origins(order[rows]))


def sorted_lengths(group: Segments, drop: np.ndarray | None = None, *, parts: OpenParts) -> np.ndarray:
    """A group's payload lengths in output order (less ``drop``), from the segments' heads alone
    (no payload read)."""
    keys, order, lengths, _ = _load_group(group, parts=parts, payloads=False)
    return lengths[in_output_order(keys, order, drop)]
