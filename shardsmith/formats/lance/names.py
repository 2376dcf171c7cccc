"""What the writer, the table and the readers of a Lance output share: its folder's names, the
data files' format, hashing, and pylance's log."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SUFFIX = ".lance"
FILE_VERSION = "2.1"  # Lance's data file format (``data_storage_version``), fixed: its bytes follow from it


def dataset_dir(split: str) -> str:
    """A split's Lance dataset, relative to the output: what ``lance.dataset`` opens."""
    return f"{split}{SUFFIX}"


def quiet_lance() -> None:
    """pylance's log warns on stderr of every table committed into a folder that is no dataset yet
    (each split's, by design): errors only, unless the user set ``LANCE_LOG`` (read when lance loads)."""
    os.environ.setdefault("LANCE_LOG", "error")


def hashed(path: Path) -> tuple[int, str]:
    """A finished file's size and sha256, after it is on disk."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
        while chunk := fh.read(1 << 20):
            h.update(chunk)
        return fh.tell(), h.hexdigest()
