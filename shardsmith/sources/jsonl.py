"""JSON Lines, plain or compressed (.gz, .zst): one record per line, numbered from 0.

Plain files are cut into byte ranges at line boundaries so that several workers share one big
file; the line count before each cut is counted once while planning.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from shardsmith.core.input_file import InputFile
from shardsmith.core.sizes import format_size
from shardsmith.errors import DataError
from shardsmith.kit.reader import BadRecord, Reader, RecordError, StreamError, Task
from shardsmith.kit.sample import OTHER_FIELDS

_BLOCK = 4 << 20


class JsonlReader(Reader):
    name = "jsonl"
    suffixes = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson")
    unit = "line"
    holds = "rows"
    byte_ranges = True

    def sample_fields(self, value: Any) -> dict[str, Any]:
        """The JSON object's fields as parsed (a line holding another JSON value is a bad record)."""
        if not isinstance(value, dict):
            raise RecordError(f"expected a JSON object, got {type(value).__name__}")
        return value

    def sample_schema(self, opts: Any) -> dict[str, Any]:
        return {OTHER_FIELDS: {"kind": "json"}}  # an object's keys, each a JSON value

    def plan_file(self, file: InputFile, *, chunk_bytes: int) -> list[tuple[int, int, int]]:
        if _compression(file.path) or file.size <= chunk_bytes:
            return [(0, -1, 0)]
        return _cut_at_lines(file.path, chunk_bytes)

    def reads_to_check(self, file: InputFile) -> bool:
        return False

    def reads_to_plan(self, file: InputFile, *, chunk_bytes: int) -> bool:
        return not _compression(file.path) and file.size > chunk_bytes  # lines are counted to cut it

    def sample_tasks(self, file: InputFile, *, count: int, chunk_bytes: int, rng: Any) -> list[Task]:
        """A big plain file: tasks from seeded offsets (each from the next line on, to the end of the
        file; the report stops early), without the pass that counts lines to plan it. Their record
        numbers are unknown (0)."""
        if _compression(file.path) or file.size <= chunk_bytes:
            return super().sample_tasks(file, count=count, chunk_bytes=chunk_bytes, rng=rng)
        starts = set()
        with open(file.path, "rb") as fh:
            for offset in sorted(rng.integers(0, file.size, count).tolist()):
                fh.seek(offset)
                newline = fh.read(1 << 20).find(b"\n")
                if newline >= 0 and offset + newline + 1 < file.size:
                    starts.add(offset + newline + 1)
        return [Task(index=k, file=file, start=s, stop=-1, nbytes=file.size - s) for k, s in enumerate(sorted(starts))]

    def read(self, task: Task) -> Iterator[tuple[int, Any | BadRecord]]:
        record = task.first_record
        for line in _lines(task, max_line=self.max_record_bytes):
            if isinstance(line, StreamError):
                yield record, line
                return
            if isinstance(line, _Oversized):
                yield record, BadRecord(f"a line of {format_size(line.size)} is longer than the "
                                        f"{format_size(self.max_record_bytes or 0)} one record may take within "
                                        f"--memory (its share per worker / 8); raise --memory, or split the document")
                record += 1
                continue
            stripped = line.strip()
            if stripped:
                try:
                    value: Any = orjson.loads(stripped)
                except orjson.JSONDecodeError as exc:
                    value = BadRecord(_json_reason(exc, stripped))
                yield record, value
            record += 1


    def record_offsets(self, task: Task, records: np.ndarray) -> np.ndarray | None:
        """Plain files: where each record's line starts (the task's byte range read again, newlines
        found block by block: blank lines are lines, as ``read`` counts them). Compressed: None.
        Called batch after batch of one task, each call goes on from the last line the previous
        one found (one cursor per reader), so a task's range is read about once."""
        if _compression(task.file.path):
            return None
        wanted = np.asarray(records, dtype=np.int64) - task.first_record
        key = (task.file.path, task.start, task.stop)
        line, at = 0, task.start
        cursor = getattr(self, "_cursor", None)
        if cursor is not None and cursor[0] == key and len(wanted) and cursor[1] <= wanted[0]:
            line, at = cursor[1], cursor[2]
        starts = line_starts(task.file.path, start=at, stop=task.stop, wanted=wanted - line)
        if starts is None:
            raise DataError(file=task.file.rel, reason="it holds fewer lines than were read from it: it changed "
                                                       "while it was read")
        if len(wanted):
            self._cursor = (key, int(wanted[-1]), int(starts[-1]))
        return starts


def line_starts(path: str, *, start: int, stop: int, wanted: np.ndarray, block: int = _BLOCK) -> np.ndarray | None:
    """The byte offsets of lines ``wanted`` (ascending; 0 is the line at ``start``) of the range
    ``[start, stop)`` of a plain file (``stop`` -1: to its end), read in blocks up to the last one
    wanted; None when the range ends before it."""
    out = np.empty(len(wanted), dtype=np.int64)
    at = int(np.searchsorted(wanted, 1))  # lines after the first: found after a newline
    out[:at] = start
    seen, pos = 0, start  # newlines before pos: line seen + 1 starts after the next one
    with open(path, "rb") as fh:
        fh.seek(start)
        while at < len(wanted):
            size = block if stop < 0 else min(block, stop - pos)
            data = fh.read(size) if size > 0 else b""
            if not data:
                return None
            newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
            upto = int(np.searchsorted(wanted, seen + len(newlines), side="right"))
            out[at:upto] = pos + newlines[wanted[at:upto] - seen - 1] + 1
            at, seen, pos = upto, seen + len(newlines), pos + len(data)
    return out


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
                lines += _newlines(buf, p, i + 1)
                p = i + 1
                cuts.append((start, pos + p, first_line))
                start, first_line = pos + p, lines
                target = start + chunk_bytes
            lines += _newlines(buf, p, n)
            pos += n
    if start < pos:
        cuts.append((start, pos, first_line))
    return cuts


def _newlines(buf: bytearray, a: int, b: int) -> int:
    """Newlines in ``buf[a:b]``: numpy's vectorised compare, twice as fast as ``bytearray.count``."""
    return int(np.count_nonzero(np.frombuffer(buf, dtype=np.uint8, count=b - a, offset=a) == 10)) if b > a else 0


def _compression(path: str) -> str:
    lower = path.lower()
    return "gz" if lower.endswith(".gz") else "zst" if lower.endswith(".zst") else ""


def _open(path: str) -> io.BufferedIOBase:
    kind = _compression(path)
    if kind == "gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "zst":
        return io.BufferedReader(_ZstdStream(path))
    return open(path, "rb")


class _ZstdStream(io.RawIOBase):
    """A .zst file decompressed frame after frame, that raises EOFError when the file ends inside a
    frame (zstandard's own stream reader reports a truncated file as a clean end)."""

    def __init__(self, path: str) -> None:
        import zstandard

        self._zstd = zstandard
        self._fh = open(path, "rb")  # noqa: SIM115 (closed in close())
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False
        self._out = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while not self._out:
            chunk = self._fh.read(256 << 10)
            if not chunk:
                if self._in_frame:
                    raise EOFError("the file ends inside a zstd frame (truncated)")
                return 0
            pieces = []
            while chunk:
                self._in_frame = True
                pieces.append(self._dobj.decompress(chunk))
                if not self._dobj.eof:
                    break
                chunk = self._dobj.unused_data  # the next frame starts here
                self._dobj = self._zstd.ZstdDecompressor().decompressobj()
                self._in_frame = False
            self._out = b"".join(pieces)
        n = min(len(buf), len(self._out) - self._pos)
        buf[:n] = self._out[self._pos:self._pos + n]
        self._pos += n
        if self._pos == len(self._out):
            self._out, self._pos = b"", 0
        return n

    def close(self) -> None:
        self._fh.close()
        super().close()


class _Oversized:
    """A line longer than the record limit, read past without being kept."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


def _lines(task: Task, *, max_line: int | None = None) -> Iterator[bytes | _Oversized | StreamError]:
    """The lines of a task's byte range (or the whole stream), read in blocks; a StreamError last if
    the file breaks off (small blocks for compressed streams, so little is lost before the break).

    A line that spans blocks is kept as a list of its pieces and joined once (linear in its length);
    one longer than ``max_line`` is dropped as it is read and comes out as ``_Oversized``."""
    path = task.file.path
    block_size = _BLOCK if not _compression(path) else 64 << 10
    limit = max_line if max_line is not None else 1 << 62
    try:
        with _open(path) as fh:
            if task.start:
                fh.seek(task.start)
            remaining = -1 if task.stop < 0 else task.stop - task.start
            pending: list[bytes] = []  # the pieces of the line that runs past the last block
            pending_size = 0
            oversized = False
            while remaining:
                block = fh.read(block_size if remaining < 0 else min(block_size, remaining))
                if not block:
                    break
                if remaining > 0:
                    remaining -= len(block)
                first = block.find(b"\n")
                if first < 0:  # the whole block continues the pending line
                    pending_size += len(block)
                    if pending_size > limit:
                        oversized, pending = True, []
                    elif not oversized:
                        pending.append(block)
                    continue
                head = block[:first]
                size = pending_size + len(head)
                if oversized or size > limit:
                    yield _Oversized(size)
                else:
                    yield b"".join([*pending, head]) if pending else head
                pending, pending_size, oversized = [], 0, False
                lines = block[first + 1:].split(b"\n")
                tail = lines.pop()
                for line in lines:
                    yield line if len(line) <= limit else _Oversized(len(line))
                pending_size = len(tail)
                if pending_size > limit:
                    oversized = True
                elif tail:
                    pending.append(tail)
            if pending_size:
                yield _Oversized(pending_size) if oversized else b"".join(pending)
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
