"""Which file a loader opened: a dataset is served whole from the files it was opened on, or not at all.

A loader opens shards lazily (a DataLoader worker opens its own). If the folder is rewritten in the
meantime (``--overwrite``: the old shards unlinked, new ones renamed into place), a shard opened
later would belong to the new conversion, mixed with shards of the old one already open. So the
dataset records each file's identity (device, inode, size, modification time) when it is created,
and every later open compares the file descriptor it actually got (``os.fstat``), once per shard
and process: a file that was replaced is a DatasetError, never silently another dataset's bytes.
Shards already open keep serving the old files, which stay whole while they are open.

A file truncated in place while it is mapped (by another program: nothing of shardsmith's writes a
dataset's files, or a cache's, in place) would kill its reader with SIGBUS at the first page past
its new end. So every read of a mapped file is preceded by ``intact``: one ``fstat`` (the map's
own descriptor, ``mmap.size``), and a file shorter than its map is a DatasetError naming it. A
truncation in the microseconds between that look and the copy is still SIGBUS: no check can close
that window, only keeping other programs out of the folder can (as the docs say).

Where ``intact`` runs: tokens per shard and batch, tar per sample or block of 32, HDF5 per read,
memmap per array access (an array a user keeps, ``MemmapDataset.values``, is not covered). Its cost
is that system call: a tar ``ds[i]`` pays one (about 0.3 µs on Linux; 3 µs in a sandbox whose system
calls are slow, where ``ds[i]`` went from about 11 to 14 µs), an epoch's iteration one per block of
up to 32 samples. (Before issue 42 item 10 such a truncation killed the reader with SIGBUS.)
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path
from typing import NamedTuple

from shardsmith.errors import DatasetError


class Stamp(NamedTuple):
    """A file's identity: replaced, rewritten or truncated files differ in one of these."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Stamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def stamp(path: str | os.PathLike[str], *, size: int | None = None) -> Stamp:
    """The identity of the regular file ``path`` now; DatasetError when it is missing, or not of
    ``size`` bytes (the manifest's) when that is given."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        if size is not None:
            check_size(path, None, size)
        raise DatasetError(f"{path}: missing, or not a file")
    if size is not None:
        check_size(path, st.st_size, size)
    return Stamp.of(st)


def check_size(name: str | os.PathLike[str], found: int | None, want: int) -> None:
    """A dataset file is of the size its manifest gives (``found``: its size now, None when it is
    missing): the check every open makes of every shard, on a folder (``stamp``) and at a URL (the
    listing the dataset was opened on, ``storage/streamed.py``), so that no read by offsets ever
    serves a file that is not the one the manifest describes."""
    if found != want:
        now = "no such file" if found is None else f"{found} bytes"
        raise DatasetError(f"{name}: missing or not {want} bytes as the manifest says ({now})")


def check_fd(fd: int, path: str | os.PathLike[str], want: Stamp | None) -> None:
    """The open file ``fd`` is the file the dataset was opened on."""
    if want is not None and Stamp.of(os.fstat(fd)) != want:
        raise DatasetError(f"{path}: changed since the dataset was opened (rewritten, e.g. with --overwrite?); "
                           f"open the dataset again")


def open_checked(path: str | os.PathLike[str], want: Stamp | None) -> int:
    """A read-only file descriptor of ``path``, checked against ``want``."""
    try:
        fd = os.open(Path(path), os.O_RDONLY)
    except OSError as exc:
        raise DatasetError(f"{path}: changed since the dataset was opened: cannot open it now "
                           f"({exc.strerror or exc}); open the dataset again") from None
    try:
        check_fd(fd, path, want)
    except BaseException:
        os.close(fd)
        raise
    return fd


def intact(mm: mmap.mmap, name: str | os.PathLike[str]) -> None:
    """The mapped file ``name`` still holds every byte of its map ``mm`` (see above): its size is
    looked at now, before a read, and a file truncated since it was mapped is a DatasetError."""
    now = mm.size()
    if now < len(mm):
        raise DatasetError(f"{name}: truncated to {now} of its {len(mm)} bytes while it was mapped for reading (by "
                           f"another program: keep others out of a dataset's folder and out of its cache folder); "
                           f"open the dataset again")
