"""One open HDF5 event shard: opened and checked against the manifest (format attributes, schema,
shapes, dtypes, offsets; ``checks`` for each dataset), its columns memory-mapped when uncompressed
or read through h5py otherwise, one row range or union of ranges at a time.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import pages, recycle
from shardsmith.core.events import EventSchema
from shardsmith.core.identity import Stamp, check_fd, intact, open_checked
from shardsmith.core.ragged import starts_of
from shardsmith.errors import DatasetError
from shardsmith.formats.hdf5.checks import _bad, _check_filters, _check_storage, _dataset, _equals

FORMAT = "shardsmith-events"  # the writer's root attribute (kept in sync with shardsmith.formats.hdf5.writer)
FORMAT_VERSION = 1


def _h5_ranges(ds: Any, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Rows ``[starts[k], stops[k])`` of an h5py dataset back to back: one read of a union selection."""
    from h5py import h5s

    lens = stops - starts
    inner = tuple(ds.shape[1:])
    out = np.empty((int(lens.sum()), *inner), dtype=ds.dtype)
    if len(out) == 0:
        return out
    space = ds.id.get_space()
    op = h5s.SELECT_SET
    zeros = (0,) * len(inner)
    for a, n in zip(starts[lens > 0].tolist(), lens[lens > 0].tolist()):
        space.select_hyperslab((a, *zeros), (n, *inner), op=op)
        op = h5s.SELECT_OR
    ds.id.read(h5s.create_simple(out.shape), space, out)
    return out


def _np_ranges(arr: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The same for an in-memory (memory-mapped) array: one gather for short ranges, slices for long
    (copied into recycled memory: ``core.recycle``)."""
    lens = stops - starts
    total = int(lens.sum())
    if len(starts) == 1:
        return recycle.copy(arr[int(starts[0]):int(stops[0])])
    if total <= 64 * len(starts):
        index = np.repeat(starts - starts_of(lens)[:-1], lens) + np.arange(total, dtype=np.int64)
        return arr[index]
    parts = [arr[a:b] for a, b in zip(starts.tolist(), stops.tolist())]
    return recycle.concatenate(parts) if parts else arr[:0].copy()


class _Column:
    """One dataset of an open shard: a memory-mapped array, or an h5py dataset when compressed."""

    __slots__ = ("array", "ds")

    def __init__(self, array: np.ndarray | None, ds: Any) -> None:
        self.array = array
        self.ds = ds

    def rows(self, a: int, b: int) -> np.ndarray:
        if self.array is not None:
            return recycle.copy(self.array[a:b])
        with self._reading():
            return self.ds[a:b]

    def ranges(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        if self.array is not None:
            return _np_ranges(self.array, starts, stops)
        with self._reading():
            return _h5_ranges(self.ds, starts, stops)

    def full(self) -> np.ndarray:
        if self.array is not None:
            return self.array
        with self._reading():
            return self.ds[...]

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """HDF5's errors (a damaged chunk, a failing filter) as a DatasetError naming the file."""
        try:
            yield
        except OSError as exc:
            raise DatasetError(f"{self.ds.file.filename}: cannot read {self.ds.name!r} ({exc})") from None


class _OpenShard:
    """A checked, open shard: its columns and its (validated) offsets per counter."""

    def __init__(self, path: Path, *, samples: int, schema: EventSchema, schema_json: dict[str, Any],
                 offsets: dict[str, np.ndarray] | None, stamp: Stamp | None = None) -> None:
        import h5py

        self.path = path
        self.stamp = stamp
        try:
            # HDF5's default locking, as plain h5py users open files: the same file opened twice in
            # one process must be opened with the same locking flags
            self.file = h5py.File(path, "r")
        except OSError as exc:
            raise _bad(path, f"cannot open as HDF5 ({exc})") from None
        try:
            check_fd(self.file.id.get_vfd_handle(), path, stamp)
        except BaseException:
            self.file.close()
            raise
        self.mm: mmap.mmap | None = None
        self.populated = False
        self._bytes: dict[str, memoryview] = {}
        try:
            self._check_attrs(samples, schema_json)
            self.columns: dict[str, _Column] = {}
            self.offsets: dict[str, np.ndarray] = {}
            for f in schema.fixed:
                self.columns[f.name] = self._column(f.name, (samples, *f.shape), f.np_dtype)
            for c in schema.counters:
                self._counter(c, schema, samples, None if offsets is None else offsets.get(c))
        except BaseException:
            self.close()
            raise
        self.mapped = all(col.array is not None for col in self.columns.values())
        if self.mapped:
            self.file.close()  # everything is memory-mapped: no HDF5 handle to carry around
            self.file = None
            for col in self.columns.values():
                col.ds = None

    def _check_attrs(self, samples: int, schema_json: dict[str, Any]) -> None:
        attrs = self.file.attrs
        if not _equals(attrs.get("format"), FORMAT) or not _equals(attrs.get("format_version"), FORMAT_VERSION):
            raise _bad(self.path, f"not a shardsmith event shard of format version {FORMAT_VERSION}")
        try:
            file_schema = json.loads(attrs["schema"])
        except (KeyError, TypeError, ValueError):
            raise _bad(self.path, "no readable 'schema' attribute") from None
        if file_schema != schema_json:
            raise _bad(self.path, "its schema attribute differs from the manifest's schema")
        if not _equals(attrs.get("samples"), samples):
            shown = " ".join(str(attrs.get("samples")).split())[:40]  # one line, whatever was stored
            raise _bad(self.path, f"holds {shown} events, the manifest says {samples}")

    def _column(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> _Column:
        ds = _dataset(self.file, name, self.path)
        if ds.shape != shape or ds.dtype != dtype:
            raise _bad(self.path, f"{name!r} is {ds.dtype}{list(ds.shape)}, expected {dtype}{list(shape)}")
        _check_filters(ds, self.path)
        _check_storage(ds, self.path, self.stamp.size if self.stamp is not None else os.path.getsize(self.path))
        return _Column(self._mapped(ds), ds)

    def _mapped(self, ds: Any) -> np.ndarray | None:
        """A read-only view of a contiguous, unfiltered dataset's bytes, or None to read via h5py."""
        if ds.chunks is not None or ds.compression is not None:
            return None
        if ds.size == 0:
            return np.zeros(ds.shape, dtype=ds.dtype)
        offset = ds.id.get_offset()
        if offset is None:  # refused by _check_storage: never read as fill values
            raise _bad(self.path, f"{ds.name!r} has no data stored in the file")
        if self.mm is None:
            with os.fdopen(open_checked(self.path, self.stamp), "rb") as fh:
                self.mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        if offset + ds.nbytes > len(self.mm):
            raise _bad(self.path, f"{ds.name!r} runs past the end of the file (truncated?)")
        return np.frombuffer(self.mm, dtype=ds.dtype, count=ds.size, offset=offset).reshape(ds.shape)

    def check(self) -> None:
        """The mapped file still whole (``identity.intact``): a look at its size before a read."""
        if self.mm is not None:
            intact(self.mm, self.path)

    def bytes_of(self, name: str) -> memoryview:
        """A mapped column's bytes, as one flat memoryview (made once)."""
        view = self._bytes.get(name)
        if view is None:
            array = self.columns[name].array
            assert array is not None
            view = self._bytes[name] = memoryview(array).cast("B") if array.size else memoryview(b"")
        return view

    def populate(self) -> None:
        """Map every page of the shard now (``MADV_POPULATE_READ``), once: a random batch touches a
        new page per event and field, and faulting them in one by one cost 4-6x the copy (35-60k
        events/s against over 200k/s with the pages mapped; 255 MB map in 45-75 ms from the page
        cache). Where the kernel lacks it (before Linux 5.14), pages fault in as before."""
        self.populated = True
        if self.mm is not None:
            pages.populate(self.mm)

    def _counter(self, c: str, schema: EventSchema, samples: int, known: np.ndarray | None) -> None:
        members = schema.members(c)
        first = _dataset(self.file, f"{members[0].name}/offsets", self.path)
        col = self._column(f"{members[0].name}/offsets", (samples + 1,), np.dtype(np.int64))
        if known is None:
            off = col.full()
            if off[0] != 0 or np.any(off[1:] < off[:-1]):
                raise _bad(self.path, f"offsets of counter {c!r} ({first.name}) do not start at 0 and "
                                      f"never decrease")
        else:
            off = known
        self.offsets[c] = off
        for f in members:
            if f is not members[0]:
                other = _dataset(self.file, f"{f.name}/offsets", self.path)
                # not a hard link to the first member's: its shape and storage are checked like the
                # first's before it is read whole
                if other != first and not np.array_equal(
                        self._column(f"{f.name}/offsets", (samples + 1,), np.dtype(np.int64)).full(), off):
                    raise _bad(self.path, f"{f.name!r} and {members[0].name!r} share counter {c!r} but "
                                          f"their offsets differ")
            values = _dataset(self.file, f"{f.name}/values", self.path)
            if values.shape[:1] != (int(off[-1]),):
                raise _bad(self.path, f"offsets of counter {c!r} end at {int(off[-1])} but {f.name!r} holds "
                                      f"{values.shape[0] if values.shape else 0} values")
            self.columns[f.name] = self._column(f"{f.name}/values", (int(off[-1]), *f.shape), f.np_dtype)

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(Exception):
                self.file.close()
            self.file = None
        self.columns = {}
