"""JSON Lines, plain or compressed (.gz, .zst): one record per line, numbered from 0.

Plain files are cut into byte ranges at line boundaries so that several workers share one big
file; the line count before each cut is counted once while planning.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from typing import Any

import orjson

from shardsmith.inputs import InputFile
from shardsmith.readers.base import BadRecord, Reader, StreamError, Task

_BLOCK = 4 << 20


class JsonlReader(Reader):
    name = "jsonl"
    suffixes = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson")
    unit = "line"
    byte_ranges = True

    def plan_file(self, file: InputFile, *, chunk_bytes: int) -> list[tuple[int, int, int]]:
        if _compression(file.path) or file.size <= chunk_bytes:
            return [(0, -1, 0)]
        return _cut_at_lines(file.path, chunk_bytes)

    def read(self, task: Task) -> Iterator[tuple[int, Any | BadRecord]]:
        record = task.first_record
        for line in _lines(task):
            if isinstance(line, StreamError):
                yield record, line
                return
            stripped = line.strip()
            if stripped:
                try:
                    value: Any = orjson.loads(stripped)
                except orjson.JSONDecodeError as exc:
                    value = BadRecord(_json_reason(exc, stripped))
                yield record, value
            record += 1


def _cut_at_lines(path: str, chunk_bytes: int, *, block: int = 8 << 20) -> list[tuple[int, int, int]]:
    """Byte ranges of about ``chunk_bytes`` that end after a newline, with the line number each starts at.

    One sequential pass through a reused buffer (no mmap, so the file's pages are not charged to
    this process).
    """
    cuts: list[tuple[int, int, int]] = []
    start = first_line = lines = pos = 0
    target = chunk_bytes
    buf = bytearray(block)
    with open(path, "rb") as fh:
        while n := fh.readinto(buf):
            p = 0  # newlines before p in this block are counted in `lines`
            while target - 1 < pos + n:
                i = buf.find(b"\n", max(target - 1 - pos, p), n)
                if i < 0:
                    break  # the cut falls in a later block
                lines += buf.count(b"\n", p, i + 1)
                p = i + 1
                cuts.append((start, pos + p, first_line))
                start, first_line = pos + p, lines
                target = start + chunk_bytes
            lines += buf.count(b"\n", p, n)
            pos += n
    if start < pos:
        cuts.append((start, pos, first_line))
    return cuts


def _compression(path: str) -> str:
    lower = path.lower()
    return "gz" if lower.endswith(".gz") else "zst" if lower.endswith(".zst") else ""


def _open(path: str) -> io.BufferedIOBase:
    kind = _compression(path)
    if kind == "gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "zst":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def _lines(task: Task) -> Iterator[bytes | StreamError]:
    """The lines of a task's byte range (or the whole stream), read in blocks; a StreamError last if
    the file breaks off (small blocks for compressed streams, so little is lost before the break)."""
    path = task.file.path
    block_size = _BLOCK if not _compression(path) else 64 << 10
    try:
        with _open(path) as fh:
            if task.start:
                fh.seek(task.start)
            remaining = -1 if task.stop < 0 else task.stop - task.start
            tail = b""
            while remaining:
                block = fh.read(block_size if remaining < 0 else min(block_size, remaining))
                if not block:
                    break
                if remaining > 0:
                    remaining -= len(block)
                lines = (tail + block).split(b"\n")
                tail = lines.pop()
                yield from lines
            if tail:
                yield tail
    except (OSError, EOFError) as exc:
        # Compressed streams fail here when truncated or corrupt; plain files when unreadable.
        yield StreamError(f"cannot read: {exc.strerror or exc}" if isinstance(exc, OSError) else f"cannot read: {exc}")
    except Exception as exc:  # zstandard raises its own ZstdError
        if type(exc).__name__ != "ZstdError":
            raise
        yield StreamError(f"cannot decompress: {exc}")


def _json_reason(exc: orjson.JSONDecodeError, line: bytes) -> str:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"invalid UTF-8 at byte {bad.start}"
    return f"malformed JSON: {exc.msg} at column {exc.colno}"
