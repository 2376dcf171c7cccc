"""Human sizes such as ``256MB`` or ``2GiB`` for --memory and --shard-bytes."""

from __future__ import annotations

import re

from shardsmith.errors import UsageError

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


MAX_SIZE = 1 << 50  # 1 PiB: any size beyond is a typo, and would overflow the 64-bit sums made of it


def parse_size(text: str | int, *, option: str = "size", maximum: int = MAX_SIZE) -> int:
    """Bytes from ``'256MB'``, ``'1.5GiB'`` or a plain integer; zero, negatives and sizes past
    ``maximum`` are usage errors."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
        if not match or match.group(2).lower() not in _UNITS:
            raise UsageError(f"{option}: cannot read {text!r} as a size (examples: 256MB, 2GB, 1GiB)")
        value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise UsageError(f"{option}: must be positive, got {text!r}")
    if value > maximum:
        raise UsageError(f"{option}: {text!r} is more than the {format_size(maximum)} this option takes")
    return value


def format_size(n: float) -> str:
    """``1234567`` → ``'1.2 MB'``."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
