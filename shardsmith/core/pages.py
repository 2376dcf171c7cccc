"""Advice to the kernel about a memory map's pages: map a range now, or let it go.

Mapping a range in one call (``MADV_POPULATE_READ``, Linux 5.14+) costs a fraction of faulting its
pages in one by one when they are first copied; letting a range go (``MADV_DONTNEED``) takes its
pages out of the process's resident memory while the page cache keeps the data, so a later read
faults the same bytes in again. Where the kernel or the build lacks the advice, nothing happens.
"""

from __future__ import annotations

import contextlib
import mmap
import os

# ``mmap`` names the value only where the build knew it
_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22 if os.uname().sysname == "Linux" else None)
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


def populate(mm: mmap.mmap, first: int = 0, size: int | None = None) -> None:
    """Map ``size`` bytes from ``first`` (page-aligned; default: the whole map) now."""
    _advise(mm, _POPULATE_READ, first, len(mm) - first if size is None else size)


def let_go(mm: mmap.mmap, first: int = 0, size: int | None = None) -> None:
    """Take ``size`` bytes from ``first`` (default: the whole map) out of the resident set."""
    _advise(mm, _DONTNEED, first, len(mm) - first if size is None else size)


def _advise(mm: mmap.mmap, advice: int | None, first: int, size: int) -> None:
    if advice is None or size <= 0:
        return
    with contextlib.suppress(OSError, ValueError):
        mm.madvise(advice, first, size)


def let_go_views(arrays: list) -> None:
    """Take every page of the memory maps that these arrays view out of the resident set (each map
    once; an array of anonymous memory is left alone: letting it go would zero it)."""
    seen: set[int] = set()
    for arr in arrays:
        base = arr
        while base is not None and not isinstance(base, mmap.mmap):
            base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
        if isinstance(base, mmap.mmap) and id(base) not in seen:
            seen.add(id(base))
            let_go(base)
