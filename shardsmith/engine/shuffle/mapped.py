"""The gather's reading of part files through their mapped pages, for a writer that copies each
payload once, straight into its output (``Writer.maps_parts``): no read into fresh memory first.

A group's samples stay where the scatter wrote them; ``map_group`` hands on where each one lies
(one source per part file) in output order, and ``PartMaps`` keeps the pages a gather holds
resident bounded (a batch system's memory limit counts mapped pages).
"""

from __future__ import annotations

import mmap

import numpy as np

from shardsmith.core import pages
from shardsmith.core.ragged import starts_of
from shardsmith.engine.shuffle.buckets import Origins, in_output_order
from shardsmith.engine.shuffle.partfile import HEAD_BYTES
from shardsmith.engine.shuffle.segments import Segments
from shardsmith.errors import DatasetError
from shardsmith.kit.batches import MappedBatch


class PartMaps:
    """The part files a gather maps (each once, by path), with the pages they keep resident bounded.

    A page of a file mapping counts in the process's resident memory until it is unmapped or let go,
    so a gather that kept every part file mapped would show its whole split as memory (14 GB at a
    10 GB input), which a batch system's memory limit counts and kills for. Each time ``resident``
    bytes more have been populated, every page of every map is let go (``MADV_DONTNEED``): the page
    cache keeps the data, and the ranges still to be read (the group being copied, a shard still
    being streamed) fault the same bytes in again from there."""

    def __init__(self, *, resident: int) -> None:
        self._maps: dict[str, mmap.mmap] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._since = 0
        self._resident = resident

    def source(self, path: str) -> np.ndarray:
        """A part file's bytes, read only, as its mapped pages (mapped once)."""
        arr = self._arrays.get(path)
        if arr is None:
            with open(path, "rb") as fh:
                try:
                    mm = self._maps[path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                except ValueError:  # an empty file cannot be mapped
                    raise DatasetError(f"{path}: part file shorter than its footer says") from None
            arr = self._arrays[path] = np.frombuffer(mm, dtype=np.uint8)
        return arr

    def bring_in(self, group: Segments) -> None:
        """Map the segments' pages (heads and payloads) now, a run of adjacent segments of one file
        at a time (a group's buckets lie side by side in each part file it reads). The pages of
        earlier groups are let go first when this group's would pass the bound: never the pages of
        the group being brought in."""
        ranges: list[tuple[str, int, int]] = []
        rows = np.lexsort((group.offset, group.part))  # each part file's segments together, in file order
        ends = group.offset + group.nbytes
        for path, offset, end in zip([group.paths[p] for p in group.part[rows].tolist()],
                                     group.offset[rows].tolist(), ends[rows].tolist()):
            if end > len(self.source(path)):
                raise DatasetError(f"{path}: part file shorter than its footer says")
            if ranges and ranges[-1][0] == path and ranges[-1][2] >= offset:
                ranges[-1] = (path, ranges[-1][1], max(end, ranges[-1][2]))
            elif end > offset:
                ranges.append((path, offset, end))
        spans = [(path, start - start % mmap.PAGESIZE, stop) for path, start, stop in ranges]
        size = sum(stop - first for _, first, stop in spans)
        if self._since + size > self._resident:
            self.let_go()
        for path, first, stop in spans:
            pages.populate(self._maps[path], first, stop - first)
        self._since += size

    def heads(self, group: Segments) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_load_group``'s keys, input order and lengths, from the mapped pages (``bring_in``
        first): no read call per segment."""
        heads = np.empty((3, group.samples), dtype=np.uint64)
        row = 0
        for path, offset, count, _ in group.rows():
            heads[:, row:row + count] = self.source(path)[offset:offset + HEAD_BYTES * count] \
                .view(np.uint64).reshape(3, count)
            row += count
        return heads[0], heads[1], heads[2].astype(np.int64)

    def let_go(self) -> None:
        """Every mapped page out of this process's resident set (the data stays in the page cache)."""
        for mm in self._maps.values():
            pages.let_go(mm)
        self._since = 0


def map_group(group: Segments, lo: int = 0, hi: int | None = None, *, maps: PartMaps,
              drop: np.ndarray | None = None, origins: Origins | None = None) -> MappedBatch:
    """``sort_group`` with the payloads mapped from the part files instead of read into memory:
    one source per part file (not per segment: a group holds thousands of small segments)."""
    maps.bring_in(group)
    keys, order, lengths = maps.heads(group)
    parts = np.flatnonzero(np.bincount(group.part))  # one source per part file
    seg_src = np.searchsorted(parts, group.part)
    seg_at = group.offset + HEAD_BYTES * group.count
    row_seg = np.repeat(np.arange(len(group), dtype=np.int64), group.count)
    wrong = np.flatnonzero(np.bincount(row_seg, weights=lengths, minlength=len(group)) != group.payload)
    if len(wrong):
        raise DatasetError(f"{group.path(int(wrong[0]))}: part file's sample lengths disagree with its footer")
    before = starts_of(lengths)[:-1]  # each sample's offset in the group's payloads back to back
    seg_before = starts_of(group.payload)[:-1]
    starts = seg_at[row_seg] + before - seg_before[row_seg]
    perm = in_output_order(keys, order, drop)[lo:hi]
    sources = [maps.source(group.paths[p]) for p in parts.tolist()]
    return MappedBatch(lengths=lengths[perm], sources=sources, src=seg_src.astype(np.int64)[row_seg][perm],
                       starts=starts[perm], origins=None if origins is None else origins(order[perm]))
