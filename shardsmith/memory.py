"""Keeping freed memory for reuse: on these VMs the first touch of a fresh page costs ~3 µs, so a
converter that frees and re-allocates 100 MB buffers spends more time in page faults than in
copying. glibc returns large blocks to the kernel on free; ``mallopt`` tells it to keep them.
Called by the converting commands only (a process-wide setting), never by ``import shardsmith``."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and never trim it; True when glibc took the setting."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # 512 MiB is glibc's ceiling for the mmap threshold on 64-bit systems
    return bool(mallopt(_M_MMAP_THRESHOLD, 512 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))
