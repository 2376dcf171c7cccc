"""Small files the command line reads whole beside its inputs (a tokenizer, its config and chat
template, ``--decontaminate`` benchmarks, a recipe, a loader state): each must be a regular file
of at most a stated size, checked before a byte is read.

Why not just ``read_bytes()``: a FIFO blocks the reader until someone writes to it (forever, for a
typo'd path in a script), ``/dev/zero`` or ``/dev/urandom`` never end (memory grows until the
machine kills something), and a huge or sparse file is read whole into memory. The file is
opened without blocking (a FIFO's open returns at once), checked with ``fstat`` on that same open
file (no window to swap it after the check), and read to at most its limit.
"""

from __future__ import annotations

import os
import stat

from shardsmith.core.sizes import format_size
from shardsmith.errors import UsageError

MB = 1000 * 1000  # limits in decimal units, as format_size shows them
# how large each kind of side file may be (docs/cli.md lists them)
TOKENIZER_LIMIT = 1000 * MB  # a tokenizer.json (published ones reach ~40 MB)
CONFIG_LIMIT = 100 * MB  # tokenizer_config.json, special_tokens_map.json, config.json
TEMPLATE_LIMIT = 10 * MB  # a chat template (--chat-template, chat_template.jinja)
BENCHMARK_LIMIT = 2000 * MB  # a --decontaminate file (read whole; its n-grams are kept in memory)
RECIPE_LIMIT = 10 * MB  # a recipe (shardsmith run)
STATE_LIMIT = 100 * MB  # a loader state (trace --state)

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "something else")


def _where(path: str | os.PathLike[str], what: str) -> str:
    return f"{what}: {path}" if what else str(path)


def _opened(path: str | os.PathLike[str], *, what: str, limit: int) -> int:
    """An open descriptor of ``path``, checked to be a regular file of at most ``limit`` bytes."""
    where = _where(path, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file (cannot read it)") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot open it ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{where}: {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise UsageError(f"{where}: {format_size(st.st_size)}, more than the {format_size(limit)} read for it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_side_file(path: str | os.PathLike[str], *, what: str, limit: int) -> None:
    """What ``read_side_file`` checks before reading, without reading (for a file hashed or read
    later, so that a FIFO or a huge file is refused before any work)."""
    os.close(_opened(path, what=what, limit=limit))


def read_side_file(path: str | os.PathLike[str], *, what: str, limit: int) -> bytes:
    """The bytes of ``path``; a one-line ``UsageError`` naming ``what`` (the option or file kind) and
    the path when it is missing, unreadable, not a regular file, or larger than ``limit`` bytes."""
    fd = _opened(path, what=what, limit=limit)
    try:
        chunks, got = [], 0
        while got <= limit:  # a file that grows while read stops one byte past its limit
            chunk = os.read(fd, min(limit + 1 - got, 8 * MB))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise UsageError(f"{_where(path, what)}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if got > limit:
        raise UsageError(f"{_where(path, what)}: grew past the {format_size(limit)} read for it while it was read")
    return b"".join(chunks)


def read_side_text(path: str | os.PathLike[str], *, what: str, limit: int) -> str:
    """``read_side_file`` decoded as UTF-8 (a BOM kept, as Python's ``read_text`` keeps it); a file
    that is not UTF-8 is a one-line ``UsageError``."""
    data = read_side_file(path, what=what, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{_where(path, what)}: not UTF-8 text (byte {exc.start})") from None


def is_side_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an entry to read as a side file: one that exists and is not a folder
    (a FIFO or a device is then refused by ``read_side_file`` with its reason, not passed over as
    if it were absent)."""
    return os.path.exists(path) and not os.path.isdir(path)
