"""``.npy`` bytes read back without trusting them: every sidecar the loader, ``verify``, ``trace`` and
``inspect`` read (document origins and boundaries, tar offset indexes) and every ``.npy`` member of a
tar sample goes through ``read_npy``.

``np.load`` believes the header: a header that claims 10**11 rows makes numpy allocate 2 TB before it
finds the data missing (a MemoryError traceback), an empty file raises EOFError (which the command
line's framework prints as "Aborted!"), and a zero-size dtype gives an array of any length from no
bytes. Here the header is parsed alone, checked (version, no objects, sizes that are whole numbers,
its data exactly the bytes that follow it, the dtype and dimensions the caller expects), and only
then is the array a view of those bytes: nothing is allocated that the file's real size does not
hold. Every failure is one DatasetError naming the file.
"""

from __future__ import annotations

import io
import math

import numpy as np

from shardsmith.errors import DatasetError

HEADER_MAX = 10000  # numpy's own default limit on .npy header sizes


def npy_bytes(array: np.ndarray) -> bytes:
    """``np.save`` into memory (header and data only: the same bytes every time)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def read_npy(data: bytes, *, where: str, dtype: np.dtype | None = None, kinds: str | None = None,
             ndim: int | None = None) -> np.ndarray:
    """The array of a ``.npy`` file's bytes, as a read-only view of them, checked before anything is
    allocated. ``dtype``: the one dtype it must have; ``kinds``: the dtype kinds it may have (``"iu"``);
    ``ndim``: its number of dimensions."""
    fp = io.BytesIO(data)
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fp)
        if version == (1, 0):
            shape, fortran, found = fmt.read_array_header_1_0(fp, max_header_size=HEADER_MAX)
        elif version == (2, 0):
            shape, fortran, found = fmt.read_array_header_2_0(fp, max_header_size=HEADER_MAX)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except Exception as exc:  # numpy's header parser raises many types (ValueError, EOFError, TokenError, …)
        raise DatasetError(f"{where}: not a valid .npy array ({type(exc).__name__}: {exc})") from None
    problem = _problem(found, shape, len(data) - fp.tell(), dtype=dtype, kinds=kinds, ndim=ndim)
    if problem:
        raise DatasetError(f"{where}: not the .npy array expected ({problem})")
    flat = np.frombuffer(data, dtype=found, count=math.prod(shape), offset=fp.tell())
    return flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)


def _problem(found: np.dtype, shape: tuple, size: int, *, dtype: np.dtype | None, kinds: str | None,
             ndim: int | None) -> str:
    """What is wrong with a header that describes ``size`` data bytes ("" when nothing is)."""
    if found.hasobject:
        return "object arrays need pickles, which shardsmith never loads"
    if not all(type(d) is int and d >= 0 for d in shape):
        return f"shape {shape!r} is not a tuple of sizes"
    if dtype is not None and found != dtype:
        return f"dtype {found}, expected {dtype}"
    if kinds is not None and found.kind not in kinds:
        return f"dtype {found}, expected one of the kinds {kinds!r}"
    if ndim is not None and len(shape) != ndim:
        return f"{len(shape)} dimensions, expected {ndim}"
    count = math.prod(shape)
    if found.itemsize == 0 and count:
        return f"{count} items of the empty dtype {found}"
    if size != count * found.itemsize:
        return f"{size} data bytes for shape {shape} of {found} ({count * found.itemsize} bytes)"
    return ""
