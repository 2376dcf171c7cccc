"""The part file: what one scatter task writes and every gather unit reads (the one module that
knows its layout, writing and reading).

    [segment]...  each (split, bucket) run: keys, input orders, lengths (uint64 each), then payloads
    [index]       one row per segment (``INDEX``: split, bucket, offset, count, payload bytes),
                  fixed-width little-endian, sorted by (split, bucket, offset)
    [directory]   splits + 1 little-endian uint64: the first index row of each split, then the rows
    [meta]        JSON: the task, its plan id, its records, what it skipped (``scatter.scatter_task``)
    [trailer]     ``TRAILER``: where the index starts, its rows, the splits, the meta's length, magic

Why binary and indexed (issue 43): at 1 TB / 100 ranks a gather unit parsed 9 GB of JSON footers,
twice, and held a Python object per segment. Here the meta is read without the index (the scatter's
"is this task finished" check), the index without the meta, and the rows of some splits without the
others (the directory); the rows go into numpy arrays as they are (``engine/shuffle/segments.py``). The
trailer, directory and meta of a part are read once per process (``FOOTERS``), whoever asks.

A footer is checked before anything trusts it: sizes that add up to the file's size, a directory
that is a cut of the rows, rows of their split, in order, and segments inside the payload area.
A torn or lying footer is refused in one line naming the part: the scatter's resume check then
redoes the task (``scatter.finished_task``), as it redoes a part cut into another bucket count. A
part written by an older shardsmith has another magic and is redone the same way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from shardsmith.core.fsutil import naming
from shardsmith.errors import DatasetError

PART_MAGIC = b"SSPART02"  # 01: a JSON footer of meta and segments
TRAILER = struct.Struct("<QQQQ8s")  # index offset, index rows, splits, meta bytes, magic
INDEX = np.dtype([("split", "<u4"), ("bucket", "<u4"), ("offset", "<u8"), ("count", "<u8"), ("payload", "<u8")])
HEAD_BYTES = 24  # a sample's key, input order and length, before the segment's payloads
_PIECE_BYTES = 200  # a memoryview object and its list slot


@dataclass(slots=True)
class _Run:
    keys: list[np.ndarray] = field(default_factory=list)
    order: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    payload: list[bytes | memoryview] = field(default_factory=list)
    nbytes: int = 0


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
        self._segments: list[tuple[int, int, int, int, int]] = []
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
        self._buffered += size + HEAD_BYTES * len(keys) + held
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
            self._segments.append((split, bucket, self._offset, count, run.nbytes))
            buffers += [memoryview(a).cast("B") for a in arrays]
            buffers += run.payload
            self._offset += HEAD_BYTES * count + run.nbytes
        _write_all(self._fh.fileno(), buffers)
        self._runs.clear()
        self._buffered = 0

    def write(self, meta: dict) -> None:
        """Finish the part: the last segments, the footer (``footer_bytes``); then rename it into
        place. Not fsynced: parts are scratch, as large as the dataset, and read back at once;
        fsyncing them would make the disk take the whole dataset once more before the run may end
        (measured 15.7 -> 20.2 s on 500k ROOT events). A killed process leaves its renamed parts
        whole in the page cache; after a power loss a part cut short fails its footer's checks
        and is redone."""
        try:
            self._flush()
            rows = np.array(self._segments, dtype=np.uint64).reshape(-1, 5)
            footer = footer_bytes(rows, meta, payload_end=self._offset)
            with naming(self.path):
                _write_all(self._fh.fileno(), [footer])
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


def footer_bytes(segments: np.ndarray, meta: dict, *, payload_end: int) -> bytes:
    """The footer that follows a part's segments (which end at ``payload_end``): the index of
    ``segments`` (rows of split, bucket, offset, count, payload bytes, in any order), the
    directory, the JSON ``meta`` and the trailer."""
    rows = np.zeros(len(segments), dtype=INDEX)
    for i, name in enumerate(INDEX.names):
        rows[name] = segments[:, i] if len(segments) else 0
    rows = rows[np.lexsort((rows["offset"], rows["bucket"], rows["split"]))]
    splits = int(rows["split"].max()) + 1 if len(rows) else 0
    directory = np.searchsorted(rows["split"], np.arange(splits + 1), side="left").astype("<u8")
    body = orjson.dumps(meta)
    return b"".join([rows.tobytes(), directory.tobytes(), body,
                     TRAILER.pack(payload_end, len(rows), splits, len(body), PART_MAGIC)])


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


# -- reading ------------------------------------------------------------------------------------------


def footer_start(trailer: bytes, size: int, *, name: str) -> int:
    """Where the footer (index, directory, meta, trailer) of a part of ``size`` bytes starts, from
    its last ``TRAILER.size`` bytes (a part in object storage is fetched from there: ``outstages``)."""
    return _Layout.of(trailer, size, name=name).index_at


@dataclass(frozen=True)
class _Layout:
    """A trailer's figures, checked against the file's size."""

    index_at: int
    rows: int
    splits: int
    meta_len: int
    size: int

    @classmethod
    def of(cls, trailer: bytes, size: int, *, name: str) -> _Layout:
        if size < TRAILER.size or len(trailer) != TRAILER.size:
            raise DatasetError(f"{name}: truncated part file")
        index_at, rows, splits, meta_len, magic = TRAILER.unpack(trailer)
        if magic != PART_MAGIC:
            raise DatasetError(f"{name}: not a whole shardsmith part file of this version (cut short, foreign or older)")
        if max(index_at, rows, splits, meta_len) > size or \
                index_at + INDEX.itemsize * rows + 8 * (splits + 1) + meta_len + TRAILER.size != size:
            raise DatasetError(f"{name}: torn part file (its trailer does not add up to its size)")
        return cls(index_at=index_at, rows=rows, splits=splits, meta_len=meta_len, size=size)

    @property
    def directory_at(self) -> int:
        return self.index_at + INDEX.itemsize * self.rows


@dataclass
class Footer:
    """A part's trailer, directory and meta, checked; its index rows are read when asked for."""

    path: str
    layout: _Layout
    directory: np.ndarray  # the first row of each split, then the rows
    meta_bytes: bytes
    stamp: tuple[int, int, int]
    _meta: dict[str, Any] | None = None

    @property
    def meta(self) -> dict[str, Any]:
        """The task's record of itself (parsed once)."""
        if self._meta is None:
            try:
                meta = orjson.loads(self.meta_bytes)
            except orjson.JSONDecodeError:
                meta = None
            if not isinstance(meta, dict):
                raise DatasetError(f"{self.path}: part file's meta is not a JSON object")
            self._meta = meta
        return self._meta

    def rows(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """The index rows (``INDEX``) of splits ``[first, stop)`` (every split: the defaults), read
        from the file and checked."""
        n = self.layout.splits
        first, stop = min(first, n), min(n if stop is None else stop, n)
        if stop <= first:
            return np.zeros(0, dtype=INDEX)
        a, b = int(self.directory[first]), int(self.directory[stop])
        with open(self.path, "rb") as fh:
            data = os.pread(fh.fileno(), INDEX.itemsize * (b - a), self.layout.index_at + INDEX.itemsize * a)
        return self.checked(np.frombuffer(data, dtype=INDEX) if len(data) == INDEX.itemsize * (b - a) else None,
                            first, stop)

    def checked(self, rows: np.ndarray | None, first: int, stop: int) -> np.ndarray:
        """``rows`` (those of splits ``[first, stop)``), refused unless each is of the split the
        directory puts it in, in (bucket, offset) order, and inside the payload area."""
        if rows is None:
            raise DatasetError(f"{self.path}: part file shorter than its footer says")
        split, bucket, offset = rows["split"], rows["bucket"].astype(np.int64), rows["offset"]
        cuts = (self.directory[first:stop + 1] - self.directory[first]).tolist()
        for s, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]), start=first):
            if b - a and (split[a] != s or split[b - 1] != s or np.any(split[a:b] != s)):
                raise DatasetError(f"{self.path}: part file's index disagrees with its directory")
            step = np.diff(bucket[a:b])
            if np.any(step < 0) or np.any((step == 0) & (offset[a + 1:b] <= offset[a:b - 1])):
                raise DatasetError(f"{self.path}: part file's index is not in (split, bucket, offset) order")
        end = self.layout.index_at
        count, payload = rows["count"], rows["payload"]
        if len(rows) and (offset.max() > end or count.max() > end // HEAD_BYTES or payload.max() > end
                          or np.any(offset + np.uint64(HEAD_BYTES) * count + payload > np.uint64(end))):
            raise DatasetError(f"{self.path}: part file's index points outside its payload area")
        return rows


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_footer(path: str | Path, *, rows: bool = False) -> tuple[Footer, np.ndarray | None]:
    """A part's footer, checked (a torn, foreign or lying one: a ``DatasetError`` naming the part);
    with ``rows`` its whole index too, from the same open and read."""
    name = str(path)
    with open(name, "rb") as fh:
        st = os.fstat(fh.fileno())
        layout = _Layout.of(os.pread(fh.fileno(), TRAILER.size, max(0, st.st_size - TRAILER.size)), st.st_size,
                            name=name)
        at = layout.index_at if rows else layout.directory_at
        data = os.pread(fh.fileno(), st.st_size - TRAILER.size - at, at)
    if len(data) != st.st_size - TRAILER.size - at:
        raise DatasetError(f"{name}: part file shorter than its footer says")
    skip = layout.directory_at - at
    directory = np.frombuffer(data, dtype="<u8", count=layout.splits + 1, offset=skip).astype(np.int64)
    if directory[0] != 0 or directory[-1] != layout.rows or np.any(np.diff(directory) < 0):
        raise DatasetError(f"{name}: part file's directory is not a cut of its index")
    footer = Footer(path=name, layout=layout, directory=directory, meta_bytes=data[skip + 8 * (layout.splits + 1):],
                    stamp=_stamp(st))
    index = None
    if rows:
        index = footer.checked(np.frombuffer(data, dtype=INDEX, count=layout.rows), 0, layout.splits)
    return footer, index


class Footers:
    """The footers this process has read, by path (a part replaced since is read again): the
    scatter's resume check and the gather's tables read a part's trailer, directory and meta once."""

    def __init__(self) -> None:
        self._seen: dict[str, Footer] = {}

    def footer(self, path: str | Path) -> Footer:
        """A part's footer, read once (``read_footer``)."""
        known = self._known(path)
        if known is not None:
            return known
        footer, _ = read_footer(path)
        self._seen[str(path)] = footer
        return footer

    def rows(self, path: str | Path) -> np.ndarray:
        """A part's whole index, checked: from its known footer, or with it in one read."""
        known = self._known(path)
        if known is not None:
            return known.rows()
        footer, index = read_footer(path, rows=True)
        self._seen[str(path)] = footer
        assert index is not None
        return index

    def _known(self, path: str | Path) -> Footer | None:
        known = self._seen.get(str(path))
        if known is None:
            return None
        try:
            if _stamp(os.stat(path)) == known.stamp:
                return known
        except OSError:
            pass
        del self._seen[str(path)]
        return None

    def forget(self) -> None:
        self._seen.clear()


FOOTERS = Footers()
