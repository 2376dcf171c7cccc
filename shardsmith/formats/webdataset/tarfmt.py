"""The bytes of a webdataset tar shard: deterministic POSIX ustar headers out, strict parsing in.

Written without the ``tarfile`` module: the writer needs headers without per-member objects, and
the loader validates every header of a shard once, trusting nothing: ``check_headers`` does it for
thousands of shardsmith's own headers at once in numpy, ``parse_members`` for anything else.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, NamedTuple

import numpy as np

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


# -- many headers at once -------------------------------------------------------------------------
# A header ``member_header`` writes differs from its template only in the name (bytes 0:100), the
# eleven size digits (124:135) and the six checksum digits (148:154); every other byte is constant.
_VARIES = np.r_[0:MAX_NAME, 124:135, 148:154]
_ROWS = 1024  # headers checked at a time: numpy's passes over them stay in the CPU cache
_T64 = np.tile(np.frombuffer(member_header("k", 0), np.uint8), (_ROWS, 1))  # tiled: no per-row loops
_T64[:, _VARIES] = 0
_T64 = _T64.view(np.uint64)
_K64 = np.full((_ROWS, BLOCK), 0xFF, np.uint8)  # which bytes are constant
_K64[:, _VARIES] = 0
_K64 = _K64.view(np.uint64)
_POW11 = 8 ** np.arange(10, -1, -1, dtype=np.int64)
_POW6 = _POW11[5:]
_SUM_BASE = _CONST_SUM - sum(_HEAD)  # a header's sum, less the sum of its bytes 0:136
_ZERO, _DOT, _SLASH = np.uint8(0), np.uint8(ord(".")), np.uint8(ord("/"))


class Headers(NamedTuple):
    """check_headers' answer, one row per header."""

    ok: np.ndarray  # bool: a header member_header writes, with a name _parse accepts if it is UTF-8
    size: np.ndarray  # int64: the member's size (for ok rows)
    names: np.ndarray  # (m, 100) uint8: the raw name fields
    length: np.ndarray  # int64: bytes before the name's first NUL (100 if none)
    dot: np.ndarray  # int64: where the name's first dot is (0 if none)


def check_headers(blocks: np.ndarray, index: np.ndarray) -> Headers:
    """``parse_header`` for many headers at once: the 512-byte ``blocks[index]``.

    ``blocks`` is an (n, 512) uint8 view of a shard. ``ok`` marks the headers ``member_header``
    writes (every constant byte, eleven size digits, a correct six-digit checksum) whose name
    ``_parse`` accepts once it is UTF-8: NULs only trailing, at least one byte, no '/' or '..'. The
    caller decodes the names. Any other header, valid or not, is not ok: its sample belongs to
    ``parse_members``, which accepts it or names the fault.
    """
    return _check_headers(blocks, index, _scratch())


def _scratch() -> np.ndarray:
    """Room for a chunk of header rows and their differences from the template, used over and over."""
    return np.empty((2, _ROWS, BLOCK), np.uint8)


def _check_headers(blocks: np.ndarray, index: np.ndarray, scratch: np.ndarray) -> Headers:
    """check_headers in chunks of _ROWS headers, gathered into ``scratch`` (see _scratch)."""
    m = len(index)
    if m and (index.min() < 0 or index.max() >= len(blocks)):
        raise ValueError(f"header blocks {index.min()}..{index.max()} are not all among the {len(blocks)}")
    out = Headers(np.empty(m, bool), np.empty(m, np.int64), np.empty((m, MAX_NAME), np.uint8),
                  np.empty(m, np.int64), np.empty(m, np.int64))
    rows, diff = scratch[0], scratch[1].view(np.uint64)
    for a in range(0, m, _ROWS):
        b = min(a + _ROWS, m)
        chunk = rows[:b - a]
        np.take(blocks, index[a:b], axis=0, out=chunk, mode="clip")  # (in range: checked above)
        out.names[a:b] = chunk[:, :MAX_NAME]
        _check_rows(chunk, diff[:b - a], Headers(*(x[a:b] for x in out)))
    return out


def _check_rows(rows: np.ndarray, diff: np.ndarray, out: Headers) -> None:
    """check_headers on up to _ROWS rows (in the CPU cache): whole-chunk tests, row by row if one fails."""
    m, names = len(rows), out.names
    np.bitwise_xor(rows.view(np.uint64), _T64[:m], out=diff)
    diff &= _K64[:m]
    size_digits = rows[:, 124:135] - np.uint8(ord("0"))  # 0..7 when octal (uint8 wraps below '0')
    sum_digits = rows[:, 148:154] - np.uint8(ord("0"))
    np.matmul(size_digits, _POW11, out=out.size)
    ok = out.ok
    np.equal(sum_digits @ _POW6, np.add.reduce(rows[:, :136], axis=1, dtype=np.uint16) + _SUM_BASE, out=ok)
    flat = names.reshape(-1)
    nul = flat == _ZERO
    dot = flat == _DOT
    out.dot[:] = dot.reshape(m, MAX_NAME).argmax(axis=1)
    first_nul = nul.reshape(m, MAX_NAME).argmax(axis=1)
    out.length[:] = np.where(nul[first_nul + np.arange(0, m * MAX_NAME, MAX_NAME)], first_nul, MAX_NAME)
    bad = np.empty((m, MAX_NAME), bool)  # bad[i, j]: name i is bad at byte j
    run = bad.reshape(-1)[:-1]
    np.logical_and(nul[:-1], ~nul[1:], out=run)  # a NUL before the name's end
    run |= dot[:-1] & dot[1:]  # '..'
    bad[:, -1] = False  # those pairs were byte 99 and the next name's byte 0
    bad |= names == _SLASH
    bad[:, 0] |= nul[::MAX_NAME]  # an empty name
    if diff.max() or size_digits.max() > 7 or sum_digits.max() > 7 or bad.any():
        ok &= ~diff.any(axis=1)
        ok &= size_digits.max(axis=1) <= 7
        ok &= sum_digits.max(axis=1) <= 7
        ok &= ~bad.any(axis=1)


# -- every sample of a shard at once --------------------------------------------------------------


class ShardMembers(NamedTuple):
    """A shard's samples as arrays: the members of sample j are ``first[j]:first[j + 1]``."""

    keys: list[str]
    first: np.ndarray  # int64, n + 1
    data: np.ndarray  # int64: where each member's bytes start
    size: np.ndarray  # int64
    ext: np.ndarray  # int64: index into exts
    exts: list[str]  # in order of first use


_SAMPLES = 1 << 15  # samples scanned together: bounds the (samples, 100) name arrays
_FREE_LEVELS = 8  # member levels always done in numpy; past them a handful of long samples…
_FEW = 64  # …go to parse_sample, so that a few huge samples do not cost a numpy round per member


def scan_samples(buf: Any, offsets: Any, *, where: str = "tar") -> ShardMembers:
    """``parse_sample`` of every sample ``offsets`` (n + 1 byte positions) delimit, in numpy.

    Samples are walked one member level at a time: the headers of every sample's k-th member are
    checked together (``check_headers``), names split at their first dot, keys compared, ranges
    filled. A sample with any header that is not ``member_header``'s own, any doubt about a name,
    or any fault goes through ``parse_sample``, so foreign headers parse and faults raise exactly
    as there (the first faulty sample in order raises).
    """
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1)
    n = max(len(bounds) - 1, 0)
    scan = _Scan(buf, bounds, where)
    for a in range(0, n, _SAMPLES):
        scan.block(a, min(a + _SAMPLES, n))
    return scan.finish()


class _Scan:
    """scan_samples' state: members found so far, block by block, and which samples are slow."""

    def __init__(self, buf: Any, bounds: np.ndarray, where: str) -> None:
        self.buf, self.bounds, self.where = buf, bounds, where
        self.n = n = max(len(bounds) - 1, 0)
        count = len(buf) // BLOCK
        self.blocks = (np.frombuffer(buf, np.uint8, count=count * BLOCK) if count else np.zeros(0, np.uint8)
                       ).reshape(count, BLOCK)
        starts, stops = bounds[:-1], bounds[1:]
        self.end = int(bounds[-1]) if n else 0
        # parse_members' range test: samples that fail it raise there
        self.fast = (starts >= 0) & (starts < stops) & (stops <= len(buf)) & (starts % BLOCK == 0) \
            & (stops % BLOCK == 0)
        self.keys: list[str] = [""] * n
        self.exts: list[str] = []
        self.ext_ids: dict[bytes, int] = {}
        self.parts: list[tuple[np.ndarray, ...]] = []  # (sample, data, size, ext) of fast samples
        self.scratch = _scratch()

    def block(self, a: int, b: int) -> None:
        """Samples a..b-1, one member level at a time."""
        bounds, fast = self.bounds, self.fast
        stops = bounds[1:]
        live = np.flatnonzero(fast[a:b]) + a
        # level 0 also reads the header where sample b starts: sample b-1's cut check compares it
        read = np.concatenate([live, [b]]) if b < self.n and fast[b] else live
        ok, size, names, length, dot = _check_headers(self.blocks, bounds[read] // BLOCK, self.scratch)
        names0 = np.zeros((b - a + 1, MAX_NAME), np.uint8)  # the raw name bytes where each sample starts
        names0[read - a] = names
        read0 = np.zeros(b - a + 1, bool)
        read0[read - a] = True
        dot0 = np.zeros(b - a + 1, np.int64)
        members: list[tuple[np.ndarray, ...]] = []
        level_exts: set[int] | None = set()  # one extension per level, all different: none repeats
        pos = bounds[live]
        level = 0
        while live.size:
            if level == 0:
                ok, size, names, length, dot = (x[:len(live)] for x in (ok, size, names, length, dot))
            elif level >= _FREE_LEVELS and live.size < _FEW:
                fast[live] = False
                break
            else:
                ok, size, names, length, dot = _check_headers(self.blocks, pos // BLOCK, self.scratch)
            ok &= (dot > 0) & (dot + 1 < length)  # a key and an extension
            if level == 0:
                dot0[live - a] = dot
            else:  # the same key: equal bytes up to and including the dot
                width = int(dot.max()) + 1
                key0 = names0[:len(live), :width] if len(live) == b - a else names0[live - a, :width]
                ok &= _first_difference(names[:, :width], key0) > dot
            nxt = pos + BLOCK + size + (-size % BLOCK)
            ok &= nxt <= stops[live]
            if ok.all():  # (the usual case: no copies)
                ext = self._ext_ids(names, dot, length)
            else:
                ext = np.full(len(live), -1)
                ext[ok] = self._ext_ids(names[ok], dot[ok], length[ok])
            ok &= ext >= 0
            if not ok.all():
                fast[live[~ok]] = False
                live, pos, size, ext, nxt = live[ok], pos[ok], size[ok], ext[ok], nxt[ok]
            members.append((live, pos + BLOCK, size, ext))
            if level_exts is not None and len(ext):
                first = int(ext[0])
                level_exts = None if first in level_exts or (ext != first).any() else level_exts | {first}
            more = nxt < stops[live]
            live, pos = live[more], nxt[more]
            level += 1
        self._finish_block(a, b, members, names0, read0, dot0, level_exts is None)

    def _ext_ids(self, names: np.ndarray, dot: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Extension ids of names (ok so far): each ``names[i, dot[i]+1:length[i]]``; -1 if not UTF-8."""
        m = len(names)
        if not m:
            return np.zeros(0, np.int64)
        width = int((length - dot).max()) - 1
        cols = dot[:, None] + 1 + np.arange(width)
        ext = np.take_along_axis(names, np.minimum(cols, MAX_NAME - 1), axis=1)
        ext[cols >= length[:, None]] = 0
        if (ext == ext[0]).all():
            uniq, inverse = ext[:1], np.zeros(m, np.int64)
        else:
            uniq, inverse = np.unique(ext, axis=0, return_inverse=True)
        ids = np.empty(len(uniq), np.int64)
        for u, row in enumerate(uniq):
            raw = row.tobytes().rstrip(b"\x00")
            if raw not in self.ext_ids:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    ids[u] = -1
                    continue
                self.ext_ids[raw] = len(self.exts)
                self.exts.append(text)
            ids[u] = self.ext_ids[raw]
        return ids[inverse.reshape(-1)]

    def _finish_block(self, a: int, b: int, members: list[tuple[np.ndarray, ...]], names0: np.ndarray,
                      read0: np.ndarray, dot0: np.ndarray, repeats: bool) -> None:
        fast = self.fast
        if not members:
            return
        sample, data, size, ext = (np.concatenate(x) for x in zip(*members))
        if repeats:  # an extension may repeat: look for two members of one sample with the same id
            codes = sample * (len(self.exts) + 1) + ext
            codes.sort()
            fast[codes[1:][codes[1:] == codes[:-1]] // (len(self.exts) + 1)] = False
        # the cut check: the bytes at sample j's end must not start with its key and a dot
        ahead = np.flatnonzero(fast[a:b])
        ahead = ahead[self.bounds[ahead + a + 1] < self.end]
        width = int(dot0.max()) + 1
        if len(ahead) and ahead[-1] == len(ahead) - 1:  # 0, 1, 2, …: a view is cheaper than a copy
            cut = _first_difference(names0[1:len(ahead) + 1, :width], names0[:len(ahead), :width]) \
                > dot0[:len(ahead)]
        else:
            cut = _first_difference(names0[ahead + 1, :width], names0[ahead, :width]) > dot0[ahead]
        cut |= ~read0[ahead + 1]  # not read (the next range is not whole blocks): parse_sample looks
        fast[ahead[cut] + a] = False
        # keys: UTF-8 up to the first dot
        ready = np.flatnonzero(fast[a:b])
        every = len(ready) == b - a
        names0, dot0 = (names0[:b - a], dot0[:b - a]) if every else (names0[ready], dot0[ready])
        if len(dot0) and dot0.min() == dot0.max():  # keys of one length: cut the names there
            width, step = int(dot0[0]), 1
            raw = np.ascontiguousarray(names0[:, :width]).view(f"S{width}").reshape(-1).tolist()
        else:  # a NUL for each name's first dot: b"key\0ext", two strings once split at NULs
            names0[np.arange(len(names0)), dot0] = 0
            raw = names0.view(f"S{MAX_NAME}").reshape(-1).tolist()
            step = 2
        try:
            texts = b"\x00".join(raw).decode("utf-8").split("\x00")[::step]
        except UnicodeDecodeError:  # UTF-8 is self-synchronising: only the bad keys fail alone
            raw = [k.partition(b"\x00")[0] for k in raw]
            texts = [k.decode("utf-8", "replace") for k in raw]
            for i, k in zip(ready.tolist(), raw):
                try:
                    k.decode("utf-8")
                except UnicodeDecodeError:
                    fast[i + a] = False
        if every:
            self.keys[a:b] = texts
        else:
            for i, text in zip(ready.tolist(), texts):
                self.keys[i + a] = text
        keep = fast[sample]
        order = np.argsort(sample[keep], kind="stable")  # sample order, levels in order within one
        self.parts.append(tuple(x[keep][order] for x in (sample, data, size, ext)))

    def finish(self) -> ShardMembers:
        parts = self.parts
        slow = np.flatnonzero(~self.fast)
        if len(slow):
            rows: list[tuple[int, int, int, int]] = []
            ids = {ext: i for i, ext in enumerate(self.exts)}
            for j in slow.tolist():
                start, stop = int(self.bounds[j]), int(self.bounds[j + 1])
                key, found = parse_sample(self.buf, start, stop, self.end, where=self.where)
                self.keys[j] = key
                for ext, data, size in found:
                    if ext not in ids:
                        ids[ext] = len(self.exts)
                        self.exts.append(ext)
                    rows.append((j, data, size, ids[ext]))
            extra = np.array(rows, np.int64).reshape(-1, 4).T
            parts = [*parts, tuple(extra)]
        sample, data, size, ext = (np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64)
                                   for i in range(4))
        if len(slow):
            order = np.argsort(sample, kind="stable")
            sample, data, size, ext = sample[order], data[order], size[order], ext[order]
        first = np.zeros(self.n + 1, np.int64)
        np.cumsum(np.bincount(sample, minlength=self.n), out=first[1:])
        # number extensions by first use, as a member-by-member parse would
        used, at = np.unique(ext, return_index=True)
        used = used[np.argsort(at)]
        renumber = np.zeros(len(self.exts), np.int64)
        renumber[used] = np.arange(len(used))
        return ShardMembers(self.keys, first, data, size, renumber[ext], [self.exts[u] for u in used.tolist()])


def _first_difference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row, the first column where x and y differ (their width when they are equal)."""
    diff = x != y
    first = diff.argmax(axis=1)
    return np.where(diff[np.arange(len(x)), first], first, x.shape[1])


# -- the offset index ---------------------------------------------------------------------------
# ``{split}-{000000}.offsets.npy`` is one int64 array. Version 1 held only where each of the n
# samples' first header starts, then where the end-of-archive blocks start (n + 1 offsets). Version
# 2 (written since) starts with a head of 8 numbers, then holds those offsets, each sample's first
# member (n + 1), each member's data offset, size and extension number (m each), and a blob of
# UTF-8 bytes: the keys, then the extensions (numbered by first use), NUL-separated and padded to
# whole int64s. A reader takes a shard's member table straight from it, without its tar headers.
INDEX_MAGIC = int.from_bytes(b"SSIDX\x00\x00\x02", "little")
INDEX_VERSION = 2
_INDEX_HEAD = 8  # magic, version, n, m, extensions, key bytes, extension bytes, 0


def index_array(offsets: Any, first: Any, data: Any, size: Any, ext_names: list[str], keys: list[str]) -> np.ndarray:
    """The version-2 offset index of a shard: ``offsets`` (n + 1), ``first`` (n + 1: each sample's
    first member, then m), each member's ``data`` offset, ``size`` and extension name, each sample's key."""
    exts = list(dict.fromkeys(ext_names))  # numbered by first use, as a member-by-member parse numbers them
    ids = {e: i for i, e in enumerate(exts)}
    key_blob = "\x00".join(keys).encode("utf-8")
    ext_blob = "\x00".join(exts).encode("utf-8")
    blob = key_blob + ext_blob
    blob += bytes(-len(blob) % 8)
    head = [INDEX_MAGIC, INDEX_VERSION, len(keys), len(ext_names), len(exts), len(key_blob), len(ext_blob), 0]
    return np.concatenate([np.asarray(head, np.int64), np.asarray(offsets, np.int64), np.asarray(first, np.int64),
                           np.asarray(data, np.int64), np.asarray(size, np.int64),
                           np.fromiter(map(ids.__getitem__, ext_names), np.int64, count=len(ext_names)),
                           np.frombuffer(blob, "<i8").astype(np.int64)])


def is_index_v2(arr: np.ndarray) -> bool:
    """Whether a loaded offset index is version 2 (version 1 starts with offset 0)."""
    return arr.ndim == 1 and len(arr) >= _INDEX_HEAD and int(arr[0]) == INDEX_MAGIC


def index_offsets(arr: np.ndarray, *, where: str) -> np.ndarray:
    """The n + 1 sample offsets of a version-2 index (its head checked; the rest by ``index_members``)."""
    _, version, n, m, e, nkey, next_, zero = (int(x) for x in arr[:_INDEX_HEAD])
    words = -(-(nkey + next_) // 8) if min(n, m, e, nkey, next_) >= 0 else -1
    if version != INDEX_VERSION or zero or words < 0 or len(arr) != _INDEX_HEAD + 2 * (n + 1) + 3 * m + words:
        raise DatasetError(f"{where}: offset index version {version} with {n} samples and {m} members does not "
                           f"match its {len(arr)} numbers")
    return arr[_INDEX_HEAD:_INDEX_HEAD + n + 1]


def index_members(arr: np.ndarray, *, where: str) -> ShardMembers:
    """A version-2 index's member table, checked: members fill their samples exactly, back to back,
    as tar lays them out; extension numbers in range and none repeated in a sample; keys and
    extensions well formed. ``index_offsets`` has checked the head, the caller the sample offsets."""
    _, _, n, m, e, nkey, next_, _ = (int(x) for x in arr[:_INDEX_HEAD])
    at = _INDEX_HEAD
    offsets = arr[at:at + n + 1]
    first = arr[at + n + 1:at + 2 * n + 2]
    data, size, ext = (arr[at + 2 * n + 2 + i * m:at + 2 * n + 2 + (i + 1) * m] for i in range(3))
    blob = arr[at + 2 * n + 2 + 3 * m:].tobytes()

    def bad(reason: str) -> DatasetError:
        return DatasetError(f"{where}: offset index: {reason}")

    counts = np.diff(first)
    if n < 1 or first[0] != 0 or first[-1] != m or (counts < 1).any():
        raise bad("each sample must own one or more members, in order")
    if (size < 0).any() or (size > MAX_SIZE).any() or (ext < 0).any() or (ext >= e).any():
        raise bad("a member size or extension number is out of range")
    # where each member's header must be: the sample's start, else right after the previous member
    end = data + size + (-size % BLOCK)
    header = np.empty(m, np.int64)
    header[1:] = end[:-1]
    header[first[:-1]] = offsets[:-1]
    if not (np.array_equal(data - BLOCK, header) and np.array_equal(end[first[1:] - 1], offsets[1:])):
        raise bad("members do not fill their samples back to back")
    if e > 1 and (counts > 1).any():
        codes = np.repeat(np.arange(n, dtype=np.int64), counts) * e + ext
        codes.sort()
        if (codes[1:] == codes[:-1]).any():
            raise bad("a sample repeats an extension")
    try:
        keys = blob[:nkey].decode("utf-8").split("\x00")
        exts = blob[nkey:nkey + next_].decode("utf-8").split("\x00")
    except UnicodeDecodeError:
        raise bad("a key or extension is not UTF-8") from None
    joined = "\x00".join(keys)
    if len(keys) != n or "" in keys or "." in joined or "/" in joined:
        raise bad(f"expected {n} keys, each non-empty without dots or slashes")
    if len(exts) != e or len(set(exts)) != e or any(not x or "/" in x or x[0] == "." or ".." in x for x in exts):
        raise bad(f"expected {e} distinct extensions, each non-empty without '/', a leading dot or '..'")
    return ShardMembers(keys, first, data, size, ext, exts)
