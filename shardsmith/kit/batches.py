"""What a writer is handed by the gather: samples of one bucket range in output order, their
payloads read into memory (``SortedBatch``) or left in the part files' mapped pages (``MappedBatch``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardsmith.core.ragged import starts_of, take_ragged


@dataclass(slots=True)
class SortedBatch:
    """Samples of one bucket range in output order: ``lengths``, and each sample's payload at
    ``starts`` in the group's ``source`` payload (as read, unsorted). ``payload`` copies them
    back to back on first use; a writer that decodes records reads them in place instead."""

    lengths: np.ndarray
    source: np.ndarray
    starts: np.ndarray
    _payload: memoryview | None = None
    # with --provenance: where each sample's document came from (``kit.doc_origin.DOC_ORIGIN``), set by the gather
    origins: np.ndarray | None = None

    @classmethod
    def of(cls, lengths: np.ndarray, payload: memoryview | np.ndarray) -> SortedBatch:
        """A batch whose payloads are already back to back in output order."""
        lengths = np.asarray(lengths, dtype=np.int64)
        flat = np.frombuffer(payload, dtype=np.uint8)
        return cls(lengths=lengths, source=flat, starts=starts_of(lengths)[:-1], _payload=memoryview(flat))

    def rows(self, i: int, j: int) -> SortedBatch:
        """Samples ``[i, j)`` of the batch (the same source: no copy)."""
        return SortedBatch(lengths=self.lengths[i:j], source=self.source, starts=self.starts[i:j],
                           origins=None if self.origins is None else self.origins[i:j])

    @property
    def payload(self) -> memoryview:
        if self._payload is None:
            start = int(self.starts[0]) if len(self.starts) else 0
            if np.array_equal(self.starts, start + starts_of(self.lengths)[:-1]):  # in order already
                self._payload = memoryview(self.source[start:start + int(self.lengths.sum())])
                return self._payload
            order = np.arange(len(self.lengths), dtype=np.int64)
            ordered = take_ragged(self.source, self.lengths, order, starts=self.starts)
            self._payload = memoryview(ordered)
        return self._payload


@dataclass(slots=True)
class MappedBatch:
    """Samples of one bucket range in output order, their payloads left in the part files' pages
    (memory-mapped, read only): sample k is ``sources[src[k]][starts[k]:starts[k] + lengths[k]]``.
    A writer that copies payloads once into its output (``Writer.maps_parts``) reads them there,
    instead of from a copy in fresh memory."""

    lengths: np.ndarray
    sources: list[np.ndarray]
    src: np.ndarray
    starts: np.ndarray
    origins: np.ndarray | None = None  # as ``SortedBatch.origins``

    def rows(self, i: int, j: int) -> MappedBatch:
        """Samples ``[i, j)`` of the batch (the same mapped pages)."""
        return MappedBatch(lengths=self.lengths[i:j], sources=self.sources, src=self.src[i:j], starts=self.starts[i:j],
                           origins=None if self.origins is None else self.origins[i:j])
