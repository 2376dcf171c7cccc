"""A listing of input files kept on disk, read a chunk at a time: memory that does not grow with the file count.

An image folder lists millions of files; as ``InputFile`` tuples with their strings they take ~900
bytes each (1.2 GB for ImageNet's 1.28M files, hundreds of GB for a LAION-sized tree). Here they
are columns in a folder: the relative paths as one UTF-8 blob with their end offsets, the numbers
as fixed-width records (``ROW``), the groups as a small table; written once, in order
(``ListingWriter``), and read back with explicit reads of the rows asked for, never mapped whole,
so a pass over the listing holds one chunk. A file's absolute path is the listing's ``prefix`` plus
its relative path (one folder's listing), or, where no prefix holds for every file, a column of
its own.

``FileListing`` is a ``Sequence[InputFile]``: code that takes a list of files takes it too (a chunk
decoded at a time as it iterates); code that needs them all at once holds ``list(listing)``. It
pickles as its folder, so a worker reads the same files. It holds local files: an object's
``origin`` (inputs staged from a URL) is not kept.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any, overload

import numpy as np
import orjson

from shardsmith.core.batched import batched
from shardsmith.core.input_file import InputFile

CHUNK = 1 << 14  # files decoded at a time by a pass over a listing
ROW = np.dtype([("index", "<i8"), ("size", "<i8"), ("mtime", "<i8"), ("ctime", "<i8"), ("ino", "<u8"),
                ("group", "<i4")])
_META = "listing.json"
_END = np.dtype("<i8")
_new = tuple.__new__  # InputFile(*row) without its Python-level __new__


def encode(texts: Sequence[str]) -> tuple[bytes, np.ndarray]:
    """Strings as one blob and their lengths (file names keep undecodable bytes)."""
    encoded = [t.encode("utf-8", "surrogateescape") for t in texts]
    return b"".join(encoded), np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))


def decode(blob: bytes, lengths: np.ndarray) -> list[str]:
    """``encode``'s strings back."""
    ends = np.cumsum(lengths).tolist()
    return [blob[a:b].decode("utf-8", "surrogateescape") for a, b in zip([0, *ends[:-1]], ends)]


def cut(blob: bytes, lengths: np.ndarray, picked: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The strings ``picked`` (positions, in that order) of an encoded blob, encoded."""
    ends = np.cumsum(lengths)
    starts = (ends - lengths).tolist()
    stops = ends.tolist()
    return b"".join([blob[starts[i]:stops[i]] for i in picked.tolist()]), lengths[picked]


class _Column:
    """A text column in a listing folder: ``NAME.bin`` (the strings) and ``NAME.end`` (their ends)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.bin, self.end = folder / f"{name}.bin", folder / f"{name}.end"

    def read(self, start: int, stop: int) -> tuple[bytes, np.ndarray]:
        """Strings ``[start, stop)``: their blob and lengths."""
        ends = read_array(self.end, _END, max(0, start - 1), stop)
        first = int(ends[0]) if start else 0
        ends = ends[1:] if start else ends
        if not len(ends):
            return b"", np.empty(0, dtype=np.int64)
        with open(self.bin, "rb") as fh:
            blob = os.pread(fh.fileno(), int(ends[-1]) - first, first)
        return blob, np.diff(ends, prepend=first)


def read_array(path: Path, dtype: np.dtype, start: int, stop: int) -> np.ndarray:
    """Records ``[start, stop)`` of a file of ``dtype`` records, read (not mapped)."""
    dtype = np.dtype(dtype)
    if stop <= start:
        return np.empty(0, dtype=dtype)
    with open(path, "rb") as fh:
        return np.fromfile(fh, dtype=dtype, count=stop - start, offset=start * dtype.itemsize)


class ListingWriter:
    """Files appended in listing order into ``folder`` (made anew), then ``close``d into a
    ``FileListing``. Only one ``append``'s files are held at a time. ``prefix``: every file's path
    is it plus the relative path (None: paths are a column of their own)."""

    def __init__(self, *, folder: Path, prefix: str | None) -> None:
        shutil.rmtree(folder, ignore_errors=True)  # a killed run's listing: written again
        folder.mkdir(parents=True)
        self.folder, self.prefix = folder, prefix
        names = ("rel",) if prefix is not None else ("rel", "path")
        self._text = {name: (open(folder / f"{name}.bin", "wb"), open(folder / f"{name}.end", "wb"), [0])  # noqa: SIM115
                      for name in names}
        self._rows = open(folder / "row.bin", "wb")  # noqa: SIM115 (closed in close)
        self._groups: dict[str, int] = {}
        self.count = 0
        self.nbytes = 0  # of the files so far

    def append(self, rows: np.ndarray, texts: dict[str, tuple[bytes, np.ndarray]], groups: Sequence[str]) -> None:
        """The next files: their ``ROW`` records (``group``: a position in ``groups``), and each
        text column (``rel``, and ``path`` without a prefix) as ``encode`` gives it."""
        if not len(rows):
            return
        ids = self._groups
        remap = np.asarray([ids.setdefault(g, len(ids)) for g in groups], dtype=np.int32)
        rows = rows.copy()
        rows["group"] = remap[rows["group"]]
        for name, (blob_fh, end_fh, last) in self._text.items():
            blob, lengths = texts[name]
            ends = np.cumsum(lengths, dtype=np.int64) + last[0]
            blob_fh.write(blob)
            end_fh.write(ends.astype(_END).tobytes())
            last[0] = int(ends[-1])
        self._rows.write(rows.astype(ROW).tobytes())
        self.count += len(rows)
        self.nbytes += int(rows["size"].sum())

    def append_files(self, files: Sequence[InputFile]) -> None:
        """The next files, as tuples (each keeps its own index)."""
        if not files:
            return
        paths, rels, indexes, sizes, groups, mtimes, ctimes, inos, _ = zip(*files)
        rows = np.empty(len(files), dtype=ROW)
        rows["index"], rows["size"], rows["mtime"], rows["ctime"], rows["ino"] = indexes, sizes, mtimes, ctimes, inos
        ids: dict[str, int] = {}
        rows["group"] = [ids.setdefault(g, len(ids)) for g in groups]
        texts = {"rel": encode(rels)}
        if self.prefix is None:
            texts["path"] = encode(paths)
        self.append(rows, texts, list(ids))

    def append_found(self, found: Sequence[tuple[Any, ...]]) -> None:
        """The next files as a folder's walk finds them, (absolute path, relative path, size, mtime,
        group, ctime, inode), each indexed by its place here (the absolute paths are the prefix's)."""
        if not found:
            return
        _, rels, sizes, mtimes, groups, ctimes, inos = zip(*found)
        rows = np.empty(len(found), dtype=ROW)
        rows["index"] = np.arange(self.count, self.count + len(found))
        rows["size"], rows["mtime"], rows["ctime"], rows["ino"] = sizes, mtimes, ctimes, inos
        ids: dict[str, int] = {}
        rows["group"] = [ids.setdefault(g, len(ids)) for g in groups]
        self.append(rows, {"rel": encode(rels)}, list(ids))

    def close(self) -> FileListing:
        for blob_fh, end_fh, _ in self._text.values():
            blob_fh.close()
            end_fh.close()
        self._rows.close()
        meta = {"prefix": None if self.prefix is None else _to_json(self.prefix), "count": self.count,
                "nbytes": self.nbytes, "groups": [_to_json(g) for g in self._groups]}
        (self.folder / _META).write_bytes(orjson.dumps(meta))
        return FileListing(folder=self.folder)


class FileListing(Sequence[InputFile]):
    """Input files on disk (``ListingWriter``), as a sequence of ``InputFile`` read in chunks."""

    def __init__(self, *, folder: Path) -> None:
        self.folder = Path(folder)
        meta = orjson.loads((self.folder / _META).read_bytes())
        self.prefix: str | None = None if meta["prefix"] is None else _from_json(meta["prefix"])
        self.count: int = meta["count"]
        self.nbytes: int = meta["nbytes"]  # the files' sizes, summed
        self.groups: list[str] = [_from_json(g) for g in meta["groups"]]  # by group id

    @classmethod
    def of(cls, files: Iterable[InputFile], *, folder: Path) -> FileListing:
        """A list of files written as a listing in ``folder`` (each keeps its path and index)."""
        writer = ListingWriter(folder=folder, prefix=None)
        for chunk in batched(files, CHUNK):
            writer.append_files(chunk)
        return writer.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (str(self.folder),))

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, i: int) -> InputFile: ...
    @overload
    def __getitem__(self, i: slice) -> list[InputFile]: ...
    def __getitem__(self, i: int | slice) -> InputFile | list[InputFile]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self.count)
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return list(self.rows(start, stop))
        j = i + self.count if i < 0 else i
        if not 0 <= j < self.count:
            raise IndexError(i)
        return self.rows(j, j + 1)[0]

    def __iter__(self) -> Iterator[InputFile]:
        for start in range(0, self.count, CHUNK):
            yield from self.rows(start, min(self.count, start + CHUNK))

    def packed(self, start: int, stop: int) -> tuple[np.ndarray, dict[str, tuple[bytes, np.ndarray]]]:
        """Files ``[start, stop)`` as ``ListingWriter.append`` takes them (groups: ``self.groups``)."""
        texts = {"rel": self._column("rel").read(start, stop)}
        if self.prefix is None:
            texts["path"] = self._column("path").read(start, stop)
        return read_array(self.folder / "row.bin", ROW, start, stop), texts

    def rows(self, start: int, stop: int) -> tuple[InputFile, ...]:
        """Files ``[start, stop)`` as ``InputFile`` tuples."""
        stop = min(stop, self.count)
        if stop <= start:
            return ()
        rows, texts = self.packed(start, stop)
        rels = decode(*texts["rel"])
        paths = decode(*texts["path"]) if self.prefix is None else list(map(self.prefix.__add__, rels))
        groups = self.groups
        return tuple(map(_new, repeat(InputFile), zip(
            paths, rels, rows["index"].tolist(), rows["size"].tolist(), [groups[g] for g in rows["group"].tolist()],
            rows["mtime"].tolist(), rows["ctime"].tolist(), rows["ino"].tolist(), repeat(""))))

    def found(self, start: int, stop: int) -> list[tuple[Any, ...]]:
        """Files ``[start, stop)`` as ``ListingWriter.append_found`` takes them (no absolute path)."""
        rows, texts = self.packed(start, min(stop, self.count))
        groups = self.groups
        return list(zip(repeat(""), decode(*texts["rel"]), rows["size"].tolist(), rows["mtime"].tolist(),
                        [groups[g] for g in rows["group"].tolist()], rows["ctime"].tolist(), rows["ino"].tolist()))

    def _column(self, name: str) -> _Column:
        return _Column(self.folder, name)


class _ListingPaths(Sequence[str]):
    """The paths of a listing's files by index, each read when asked for (a writer expanding image
    references in shuffled order asks for one at a time): two reads at most, on files kept open."""

    def __init__(self, listing: FileListing) -> None:
        self.listing = listing
        self._fds: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"listing": self.listing, "_fds": {}}

    def __len__(self) -> int:
        return len(self.listing)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        listing = self.listing
        if not 0 <= i < listing.count:
            raise IndexError(i)
        name = "rel" if listing.prefix is not None else "path"
        end, blob = self._fd(f"{name}.end"), self._fd(f"{name}.bin")
        if i:
            first, last = np.frombuffer(os.pread(end, 16, (i - 1) * 8), dtype=_END).tolist()
        else:
            first, last = 0, int(np.frombuffer(os.pread(end, 8, 0), dtype=_END)[0])
        text = os.pread(blob, last - first, first).decode("utf-8", "surrogateescape")
        return text if listing.prefix is None else listing.prefix + text

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:  # (two writer threads may open it at once: one keeps its descriptor)
            opened = os.open(self.listing.folder / name, os.O_RDONLY)
            fd = self._fds.setdefault(name, opened)
            if fd != opened:
                os.close(opened)
        return fd

    def __del__(self) -> None:
        for fd in self._fds.values():
            os.close(fd)


def paths_of(files: Sequence[InputFile]) -> Sequence[str]:
    """The files' paths by index (what a writer copying their bytes reads): a list, or for a
    listing on disk a view that reads each one when asked."""
    return _ListingPaths(files) if isinstance(files, FileListing) else [f.path for f in files]


def staged_only(files: Sequence[InputFile]) -> Sequence[InputFile]:
    """The files among which some may be staged from a URL (``origin``): none in a listing on disk,
    which holds local files, so a check of each file's origin is no pass over the listing."""
    return () if isinstance(files, FileListing) else files


def groups_of(files: Sequence[InputFile]) -> set[str]:
    """The files' groups (an image folder's classes; "" for a file directly in an input folder)."""
    return set(files.groups) if isinstance(files, FileListing) else {f.group for f in files}


def total_size(files: Sequence[InputFile]) -> int:
    """The bytes of ``files`` (a listing knows it without a pass)."""
    return files.nbytes if isinstance(files, FileListing) else sum(f.size for f in files)


def _to_json(text: str) -> str:
    """A name as JSON holds it, whatever its bytes (a folder's name need not be UTF-8)."""
    return text.encode("utf-8", "surrogateescape").decode("latin-1")


def _from_json(text: str) -> str:
    return text.encode("latin-1").decode("utf-8", "surrogateescape")


def _reopen(folder: str) -> FileListing:
    return FileListing(folder=Path(folder))


