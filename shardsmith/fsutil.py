"""Files that appear whole or not at all: write to a temporary name, fsync, rename."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_dir(folder: Path) -> None:
    """Make a rename durable: fsync the folder that holds it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write_stream(path, [data])


def atomic_write_stream(path: Path, chunks: Iterable[bytes | memoryview]) -> None:
    """Write chunks to ``path`` so that a crash never leaves a partial file under that name."""
    path = Path(path)
    tmp = _tmp(path)
    try:
        with open(tmp, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


class HashingFile:
    """A file written under a temporary name, hashed as it is written, renamed into place on commit."""

    def __init__(self, path: Path, *, buffer_bytes: int = 8 << 20) -> None:
        self.path = Path(path)
        self._tmp = _tmp(self.path)
        self._fh = open(self._tmp, "wb", buffering=buffer_bytes)  # noqa: SIM115 (closed by commit/abort)
        self._sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes | memoryview) -> None:
        self._fh.write(data)
        self._sha.update(data)
        self.bytes += len(data)

    def commit(self) -> str:
        """Flush, fsync and rename; returns the sha256 hex digest."""
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self.path)
        return self._sha.hexdigest()

    def abort(self) -> None:
        self._fh.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()
