"""Memory habits of the converters. Keeping freed memory for reuse: on these VMs the first touch of
a fresh page costs ~3 µs, so a converter that frees and re-allocates 100 MB buffers spends more
time in page faults than in copying. glibc returns large blocks to the kernel on free; ``mallopt``
tells it to keep them (called by the converting commands only, a process-wide setting, never by
``import shardsmith``). And pausing the cyclic garbage collector while many objects that hold no
cycles are made."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from collections.abc import Iterator

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and never trim it; True when glibc took the setting."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # the process's own symbols, libc's among them: ``ctypes.util.find_library`` would run
        # ``ldconfig -p`` in a child (40-100 ms of every converting process's start-up)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # 512 MiB is glibc's ceiling for the mmap threshold on 64-bit systems
    return bool(mallopt(_M_MMAP_THRESHOLD, 512 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """No cyclic garbage collection inside: for code that makes hundreds of thousands of objects
    holding no cycles at once (a listing's entries, a million memoryviews to join), which the
    collector would otherwise walk, with every object of the imported modules, again and again
    (11 % of a ROOT conversion)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
