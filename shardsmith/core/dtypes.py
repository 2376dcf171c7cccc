"""Which dtypes a dataset may declare: fixed-size numbers only.

A dtype read from a manifest or a file decides how bytes are viewed; an object dtype makes numpy
view file bytes as Python pointers (a crash), strings, voids and dates are nothing shardsmith
writes. One allow-list, used wherever a dtype comes from outside (its kinds and sizes also bound
the event schemas the converters build, which are little-endian when written).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.errors import DatasetError

_KINDS = "biufc"  # bool, signed, unsigned, floating, complex
_SIZES = (1, 2, 4, 8)  # no 16-byte types: float128 is platform-dependent, shardsmith writes none


def allowed(dt: np.dtype) -> bool:
    """A plain little-endian (or byte-order-free) number of 1 to 8 bytes: no fields, no sub-arrays."""
    return (dt.kind in _KINDS and dt.itemsize in _SIZES and dt.byteorder != ">" and dt.fields is None
            and dt.subdtype is None)


def safe_dtype(value: Any, *, field: str) -> np.dtype:
    """``np.dtype(value)`` when ``allowed``; otherwise DatasetError naming ``field``."""
    if not isinstance(value, str) or not value or len(value) > 16:
        raise DatasetError(f"{field}: {value!r} is not a dtype name")
    try:
        dt = np.dtype(value)
    except (TypeError, ValueError, SyntaxError):
        raise DatasetError(f"{field}: {value!r} is not a dtype numpy knows") from None
    if not allowed(dt):
        raise DatasetError(f"{field}: {value!r} is not a little-endian number dtype (allowed: bool, int8-64, "
                           f"uint8-64, float16-64, complex64)")
    return dt


def token_dtype(vocab_size: int) -> np.dtype:
    """Megatron's choice: uint16 below a vocabulary of 65500, else int32."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)
