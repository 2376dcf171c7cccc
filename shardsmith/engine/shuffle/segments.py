"""The segments a gather reads, as columns: where each (split, bucket) run of samples lies in the
part files, one array per field, not an object per segment.

Why columns (issue 43): a gather unit's tables hold every segment of its split; at 1 TB / 100 ranks
that is 323M segments, which as Python objects (a ``Segment`` of four ints and a path, in lists per
bucket and per group) took ~300 bytes each, most of a unit's 97 GB. Here a segment is 28 bytes (its
part file's number, offset, sample count and payload bytes), a split is one table sorted by bucket,
and a bucket group is a range of its rows (``SplitGather``), so a group is a view, not a list.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from shardsmith.engine.shuffle.partfile import FOOTERS, HEAD_BYTES, Footers
from shardsmith.errors import DatasetError


@dataclass(frozen=True, slots=True)
class Segments:
    """Runs of samples in part files, row by row: the part file (``paths[part]``), where the run
    starts, its samples and their payload bytes (heads, then payloads: ``nbytes`` in all)."""

    paths: Sequence[str]  # every part file the table names, by number (shared by the slices of a table)
    part: np.ndarray  # int32
    offset: np.ndarray  # int64
    count: np.ndarray  # int64
    payload: np.ndarray  # int64

    @classmethod
    def of(cls, rows: Sequence[tuple[str, int, int, int]]) -> Segments:
        """A few segments given as (path, offset, count, payload bytes)."""
        paths: dict[str, int] = {}
        part = np.fromiter((paths.setdefault(r[0], len(paths)) for r in rows), dtype=np.int32, count=len(rows))
        cols = np.array([r[1:] for r in rows], dtype=np.int64).reshape(-1, 3)
        return cls(paths=list(paths), part=part, offset=cols[:, 0].copy(), count=cols[:, 1].copy(),
                   payload=cols[:, 2].copy())

    def __len__(self) -> int:
        return len(self.part)

    def __getitem__(self, rows: slice | np.ndarray) -> Segments:
        return Segments(paths=self.paths, part=self.part[rows], offset=self.offset[rows], count=self.count[rows],
                        payload=self.payload[rows])

    @property
    def nbytes(self) -> np.ndarray:
        """Each segment's bytes in its part file: its heads and payloads."""
        return stored_bytes(self.count, self.payload)

    @property
    def samples(self) -> int:
        return int(self.count.sum())

    @property
    def payload_bytes(self) -> int:
        return int(self.payload.sum())

    def path(self, i: int) -> str:
        return self.paths[int(self.part[i])]

    def files(self) -> list[str]:
        """The part files its rows lie in, each once, in the order the table names them."""
        return [self.paths[p] for p in np.flatnonzero(np.bincount(self.part)).tolist()]

    def rows(self) -> list[tuple[str, int, int, int]]:
        """Each segment as (path, offset, count, payload bytes): for loops that do a read per segment."""
        return [(self.paths[p], o, c, b) for p, o, c, b in zip(self.part.tolist(), self.offset.tolist(),
                                                                 self.count.tolist(), self.payload.tolist())]

    def memory(self) -> int:
        """The bytes its columns take."""
        return sum(a.nbytes for a in (self.part, self.offset, self.count, self.payload))

    @staticmethod
    def joined(parts: Sequence[Segments]) -> Segments:
        """Tables of the same part files, one after another."""
        if not parts:
            return Segments(paths=[], part=np.zeros(0, np.int32), offset=np.zeros(0, np.int64),
                            count=np.zeros(0, np.int64), payload=np.zeros(0, np.int64))
        assert all(p.paths is parts[0].paths for p in parts)
        return Segments(paths=parts[0].paths, **{name: np.concatenate([getattr(p, name) for p in parts])
                                                 for name in ("part", "offset", "count", "payload")})


@dataclass(frozen=True)
class SplitSegments:
    """One split's segments, sorted by bucket (in each, by part file in the order given, then offset),
    and each row's bucket."""

    segments: Segments
    bucket: np.ndarray  # int64, per row


def part_indexes(paths: Sequence[str], n_splits: int, *, footers: Footers) -> Iterator[tuple[int, np.ndarray]]:
    """Each part file's number and whole index (``partfile.Footers.rows``), in ``paths``' order;
    a part naming a split the run lacks stops the run in one line."""
    for p, path in enumerate(paths):
        index = footers.rows(path)
        if len(index) and int(index["split"][-1]) >= n_splits:
            raise DatasetError(f"{path}: part file names split {int(index['split'][-1])} of a run with {n_splits}")
        yield p, index


def split_segments(paths: Sequence[str], n_splits: int, *, footers: Footers = FOOTERS) -> list[SplitSegments]:
    """Every split's segments from the index of each part file in ``paths`` (in that order: the
    tasks'), read once (``partfile.Footers``). Built a column at a time, each part's index dropped
    as soon as its columns are taken: the peak is about twice the tables, not five times."""
    names = list(map(str, paths))
    fields = ("part", "bucket", "offset", "count", "payload")
    cols: list[dict[str, list[np.ndarray]]] = [{f: [] for f in fields} for _ in range(n_splits)]
    for p, index in part_indexes(names, n_splits, footers=footers):
        cuts = np.searchsorted(index["split"], np.arange(n_splits + 1), side="left").tolist()
        for s, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            if b > a:
                rows = index[a:b]
                cols[s]["part"].append(np.full(b - a, p, dtype=np.int32))
                cols[s]["bucket"].append(rows["bucket"].astype(np.int64))
                for f in ("offset", "count", "payload"):
                    cols[s][f].append(rows[f].astype(np.int64))
    out = []
    for split in cols:
        joined = {}
        for f in fields:
            pieces = split.pop(f)
            joined[f] = np.concatenate(pieces) if pieces else np.zeros(0, np.int32 if f == "part" else np.int64)
            del pieces
        order = np.argsort(joined["bucket"], kind="stable")  # (each part's rows are in offset order already)
        for f in fields:
            joined[f] = joined[f][order]  # a column at a time: one copy alive beside the table
        del order
        bucket = joined.pop("bucket")
        out.append(SplitSegments(segments=Segments(paths=names, **joined), bucket=bucket))
    return out


def group_cuts(bucket_bytes: np.ndarray, budget: int) -> np.ndarray:
    """Consecutive buckets (each of ``bucket_bytes``, in key order) merged until a group would pass
    ``budget`` (a bucket larger than it is a group alone): the index of each group's first bucket,
    then the buckets' count."""
    cuts = [0]
    size = 0
    for i, nbytes in enumerate(bucket_bytes.tolist()):
        if i > cuts[-1] and size + nbytes > budget:
            cuts.append(i)
            size = 0
        size += nbytes
    cuts.append(len(bucket_bytes))
    return np.asarray(cuts if len(bucket_bytes) else [0], dtype=np.int64)


def stored_bytes(count: np.ndarray, payload: np.ndarray) -> np.ndarray:
    """The bytes in part files of runs of ``count`` samples and ``payload`` payload bytes: heads and payloads."""
    return payload + HEAD_BYTES * count


@dataclass(frozen=True)
class BucketRuns:
    """A split's non-empty buckets in key order, as its table's rows hold them: each bucket's id,
    its first row (then the table's rows), its samples and their payload bytes. O(buckets): what
    grouping a split needs, without its rows."""

    ids: np.ndarray
    first: np.ndarray
    count: np.ndarray
    payload: np.ndarray

    @property
    def nbytes(self) -> np.ndarray:
        """Each bucket's bytes in the part files."""
        return stored_bytes(self.count, self.payload)

    @classmethod
    def of(cls, split: SplitSegments) -> BucketRuns:
        """The buckets of a table held whole."""
        seg = split.segments
        return cls.of_rows(bucket=split.bucket, count=seg.count, payload=seg.payload)

    @classmethod
    def of_rows(cls, *, bucket: np.ndarray, count: np.ndarray, payload: np.ndarray) -> BucketRuns:
        """The buckets of rows sorted by bucket, given by their columns."""
        if not len(bucket):
            return cls.of_nothing()
        first = np.flatnonzero(np.concatenate([[True], bucket[1:] != bucket[:-1]]))
        return cls(ids=bucket[first].astype(np.int64), first=np.append(first, len(bucket)).astype(np.int64),
                   count=np.add.reduceat(count.astype(np.int64), first),
                   payload=np.add.reduceat(payload.astype(np.int64), first))

    @classmethod
    def of_nothing(cls) -> BucketRuns:
        empty = np.zeros(0, np.int64)
        return cls(ids=empty, first=np.zeros(1, np.int64), count=empty, payload=empty)

    @staticmethod
    def joined(parts: Sequence[BucketRuns]) -> BucketRuns:
        """The buckets of consecutive slices of one table (each slice's rows numbered from 0, its
        buckets after the slice before's)."""
        at = np.cumsum([0] + [int(p.first[-1]) for p in parts], dtype=np.int64)
        first = [p.first[:-1] + a for p, a in zip(parts, at[:-1].tolist())] + [at[-1:]]
        return BucketRuns(first=np.concatenate(first).astype(np.int64),
                          **{f: np.concatenate([np.zeros(0, np.int64)] + [getattr(p, f) for p in parts])
                             .astype(np.int64) for f in ("ids", "count", "payload")})
