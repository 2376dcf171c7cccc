"""ustar headers of webdataset tar shards: deterministic ones out (``member_header``,
``sample_members``, ``end_of_archive``), and strict parsing of one header, member or sample in.

Written without the ``tarfile`` module: the writer needs headers without per-member objects, and
the loader validates every header it reads, trusting nothing (``parse_members`` for any ustar
header; ``shardsmith.formats.webdataset.tarcheck`` for many of shardsmith's own at once).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from shardsmith.errors import DatasetError

BLOCK = 512
RECORD = 10240  # GNU tar and Python's tarfile pad archives to 20 blocks
MAX_NAME = 100
MAX_SIZE = 8**11 - 1  # what an 11-digit octal size field holds (8 GiB)
MAGIC = b"ustar\x0000"

_ZEROS = bytes(RECORD)
_OCTAL = b"01234567"
_REGULAR = (b"0", b"\x00")


def _field(value: int, width: int) -> bytes:
    """An octal number zero-padded to ``width - 1`` digits and NUL-terminated, as tarfile writes it."""
    return b"%0*o\x00" % (width - 1, value)


# Header = name(100) | _HEAD(mode, uid, gid) | size(12) | _MID(mtime) | chksum(8) | _TAIL(typeflag … pad)
_HEAD = _field(0o644, 8) + _field(0, 8) + _field(0, 8)
_MID = _field(0, 12)
_TAIL = b"0" + bytes(100) + MAGIC + bytes(64 + 16 + 155 + 12)  # devmajor/minor empty, as tarfile writes
_CONST_SUM = sum(_HEAD) + sum(_MID) + sum(_TAIL) + 8 * ord(" ")
_HEADER = struct.Struct("100s24s12s12s8s356s")  # name, mode+uid+gid, size, mtime, chksum, the rest
assert MAX_NAME + len(_HEAD) + 12 + len(_MID) + 8 + len(_TAIL) == BLOCK


def member_header(name: str, size: int) -> bytes:
    """The 512-byte ustar header of a regular file: mode 0644, owner 0:0, mtime 0, no user names."""
    raw = name.encode("utf-8")
    if not raw or len(raw) > MAX_NAME or b"\x00" in raw:
        raise ValueError(f"tar member name {name!r} must be 1 to {MAX_NAME} UTF-8 bytes without NULs")
    if not 0 <= size <= MAX_SIZE:
        raise ValueError(f"tar member {name!r}: size {size} does not fit a ustar header")
    size_field = _field(size, 12)
    chksum = _CONST_SUM + sum(raw) + sum(size_field)
    return raw.ljust(MAX_NAME, b"\x00") + _HEAD + size_field + _MID + b"%06o\x00 " % chksum + _TAIL


def padding(size: int) -> bytes:
    """Zeros that fill a member's data up to the next 512-byte block."""
    return _ZEROS[:-size % BLOCK]


def _length(data: bytes | memoryview) -> int:
    return data.nbytes if isinstance(data, memoryview) else len(data)


def sample_members(key: str, fields: list[tuple[str, bytes | memoryview]]) -> list[bytes | memoryview]:
    """Header, data and padding of each ``{key}.{ext}`` member, in order; the data are not copied."""
    if not key or "." in key or "/" in key:
        raise ValueError(f"sample key {key!r} must be non-empty, without dots or slashes")
    out: list[bytes | memoryview] = []
    for ext, data in fields:
        if not ext or "/" in ext or ext.startswith(".") or ".." in ext:
            raise ValueError(f"sample {key!r}: bad extension {ext!r}")
        size = _length(data)
        out.append(member_header(f"{key}.{ext}", size))
        out.append(data)
        if size % BLOCK:
            out.append(padding(size))
    return out


def end_of_archive(size_so_far: int) -> bytes:
    """Two zero blocks, then zeros up to a multiple of 10240 bytes (the archive's full record)."""
    if size_so_far < 0 or size_so_far % BLOCK:
        raise ValueError(f"archive size {size_so_far} is not a whole number of 512-byte blocks")
    total = -(-(size_so_far + 2 * BLOCK) // RECORD) * RECORD
    return bytes(total - size_so_far)


def _octal(field: bytes) -> int | None:
    """A numeric field: octal digits, optionally padded with spaces and ended by NUL/space; else None."""
    digits = field.strip(b" \x00")
    if not digits or digits.translate(None, _OCTAL):
        return None
    return int(digits, 8)


def _header_sum(block: bytes) -> int:
    """Sum of the header's bytes with the checksum field read as spaces.

    adler32's A is the byte sum modulo 65521, which is exact for up to 256 bytes: a C-speed sum.
    """
    total = (zlib.adler32(block[:256], 0) & 0xFFFF) + (zlib.adler32(block[256:], 0) & 0xFFFF)
    return total - sum(block[148:156]) + 8 * ord(" ")


class _Bad(Exception):
    """A reason a header is malformed; parse_header adds the shard and offset."""


def _parse(buf: Any, offset: int) -> tuple[str, int]:
    """(name, size) of the header at ``offset`` (512 bytes must be there); raises _Bad."""
    name, head, size_field, mid, chksum, tail = _HEADER.unpack_from(buf, offset)
    # Fast path: shardsmith's own headers, where only name, size and checksum vary.
    if not (tail == _TAIL and head == _HEAD and mid == _MID
            and chksum == b"%06o\x00 " % (_CONST_SUM + (zlib.adler32(size_field, zlib.adler32(name, 0)) & 0xFFFF))):
        _check_foreign(buf[offset:offset + BLOCK])
    raw = name.rstrip(b"\x00")
    if 0 in raw:
        raise _Bad("name holds a NUL")
    digits = size_field.strip(b" \x00")
    if not digits or digits.translate(None, _OCTAL):
        raise _Bad("size field is not octal")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad("name is not UTF-8") from None
    if not text or "/" in text or ".." in text:
        raise _Bad(f"member name {text!r} is empty or has '/' or '..'")
    return text, int(digits, 8)


def _check_foreign(block: bytes) -> None:
    """Any other valid ustar header of a regular file: magic, checksum, type, numeric fields, no prefix."""
    if block[257:265] != MAGIC:
        raise _Bad("a zero block (end of archive) inside a sample" if not block.strip(b"\x00")
                   else "not a POSIX ustar header")
    stored = _octal(block[148:156])
    if stored is None or stored != _header_sum(block):
        raise _Bad("checksum mismatch")
    if block[156:157] not in _REGULAR:
        raise _Bad(f"type {block[156:157]!r} is not a regular file")
    if block[100:148].translate(None, b"01234567 \x00"):
        raise _Bad("a numeric field holds non-octal characters")
    if block[345:500].strip(b"\x00"):
        raise _Bad("a name prefix (path) is set")


def parse_header(block: bytes, *, where: str, offset: int) -> tuple[str, int]:
    """(name, size) of one validated header block; DatasetError naming the shard and offset otherwise."""
    try:
        if len(block) != BLOCK:
            raise _Bad("truncated")
        return _parse(block, 0)
    except _Bad as exc:
        raise DatasetError(f"{where}: tar header at byte {offset}: {exc}") from None


def parse_members(buf: Any, start: int, stop: int, *, where: str = "tar") -> list[tuple[str, int, int]]:
    """(name, data offset, size) of the members that exactly fill ``buf[start:stop]``.

    ``buf`` is anything that slices to bytes (bytes, mmap). Every header is validated; each step
    advances at least one block, so corrupt input raises DatasetError and never loops.
    """
    if not (0 <= start < stop <= len(buf)) or start % BLOCK or stop % BLOCK:
        raise DatasetError(f"{where}: sample range [{start}, {stop}) is not whole blocks inside "
                           f"the {len(buf)}-byte shard")
    out = []
    offset = start
    while offset < stop:  # stop - offset >= 512: both are whole blocks
        try:
            name, size = _parse(buf, offset)
        except _Bad as exc:
            raise DatasetError(f"{where}: tar header at byte {offset}: {exc}") from None
        data = offset + BLOCK
        offset = data + size + (-size % BLOCK)
        if offset > stop:
            raise DatasetError(f"{where}: tar member {name!r} at byte {data - BLOCK} runs past its sample's "
                               f"end at byte {stop}")
        out.append((name, data, size))
    return out


def parse_sample(buf: Any, start: int, stop: int, end: int, *, where: str = "tar"
                 ) -> tuple[str, list[tuple[str, int, int]]]:
    """(key, [(ext, data offset, size)]) of the webdataset sample that exactly fills ``buf[start:stop]``.

    Members are ``{key}.{ext}``: one key (no dot), extensions that are non-empty and not repeated.
    ``end`` is where the shard's samples end: a member after ``stop`` that carries this key means
    the offset index cut the sample in two.
    """
    key = None
    members: list[tuple[str, int, int]] = []
    seen: set[str] = set()
    for name, data, size in parse_members(buf, start, stop, where=where):
        k, _, ext = name.partition(".")
        if key is None:
            key = k
        if not k or not ext or k != key or ext in seen:
            raise DatasetError(f"{where}: member {name!r} at byte {data - BLOCK} does not belong to sample "
                               f"{key!r} (empty key or extension, another key, or a repeated extension)")
        seen.add(ext)
        members.append((ext, data, size))
    assert key is not None  # parse_members returns at least one member for a non-empty range
    # An index that cuts a sample in two would pass the checks above: the next member must not
    # carry this key (a name compare, not a parse; the cut before ``start`` shows on sample i-1).
    prefix = f"{key}.".encode()
    if stop < end and buf[stop:stop + len(prefix)] == prefix:
        raise DatasetError(f"{where}: the offset index ends sample {key!r} at byte {stop}, inside the sample")
    return key, members
