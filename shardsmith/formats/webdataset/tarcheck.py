"""``check_headers``: many of shardsmith's own tar headers validated at once in numpy, against the
template ``member_header`` writes; any other header is left to ``parse_members`` (tarheader).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shardsmith.formats.webdataset.tarheader import _CONST_SUM, _HEAD, BLOCK, MAX_NAME, member_header

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
