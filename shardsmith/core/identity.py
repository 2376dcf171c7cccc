"""Which file a loader opened: a dataset is served whole from the files it was opened on, or not at all.

A loader opens shards lazily (a DataLoader worker opens its own). If the folder is rewritten in the
meantime (``--overwrite``: the old shards unlinked, new ones renamed into place), a shard opened
later would belong to the new conversion, mixed with shards of the old one already open. So the
dataset records each file's identity (device, inode, size, modification time) when it is created,
and every later open compares the file descriptor it actually got (``os.fstat``), once per shard
and process: a file that was replaced is a DatasetError, never silently another dataset's bytes.
Shards already open keep serving the old files, which stay whole while they are open.
"""

from __future__ import annotations

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
    if st is None or not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
        raise DatasetError(f"{path}: missing or not {size} bytes as the manifest says" if size is not None
                           else f"{path}: missing, or not a file")
    return Stamp.of(st)


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
