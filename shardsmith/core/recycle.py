"""Recycled output memory for batches. A batch of a few hundred events is ~1 MB of fresh arrays;
glibc hands large blocks back to the kernel when a batch is freed (its heap top, or one mmap each),
so the next batch faults every page in again: ~2 µs per 4 KiB page, 3-4x the copy itself (a window
of 256 IceCube-like events: 520 µs of faults against 70 µs of memcpy). Arrays from ``empty`` keep
their memory after the caller drops them: a finalizer puts it back in a bounded free list, and the
next batch of about the same size reuses its pages. Nothing is ever handed out twice while in use:
memory comes back only when the array and every view of it (a view's ``base`` is that array, a
tensor from ``torch.from_numpy`` holds it) are gone. Process-wide and without a lock: list
``append`` and ``pop`` are atomic, and the bound on what is kept is approximate under threads.
"""

from __future__ import annotations

import weakref

import numpy as np

SMALLEST = 64 << 10  # smaller arrays come from malloc's bins, which keep their memory anyway
LARGEST = 32 << 20  # larger ones (a batch of 8000 such events) are rare enough to allocate afresh
KEEP_BYTES = 64 << 20  # free memory kept for reuse per process, at most (about)


def _capacity(nbytes: int) -> int:
    """``nbytes`` rounded up to a quarter of its power of two: size classes waste at most 25 %."""
    step = 1 << max(0, nbytes.bit_length() - 3)
    return -(-nbytes // step) * step


class BufferPool:
    """Free blocks by capacity; ``empty`` takes one (or makes one), a finalizer gives it back."""

    def __init__(self, *, keep_bytes: int = KEEP_BYTES) -> None:
        self._free: dict[int, list[np.ndarray]] = {}
        self._kept = 0
        self._keep_bytes = keep_bytes

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous array, like ``np.empty``, in recycled memory when large."""
        dtype = np.dtype(dtype)
        count = 1
        for n in shape:
            count *= int(n)
        nbytes = count * dtype.itemsize
        if not SMALLEST <= nbytes <= LARGEST:
            return np.empty(shape, dtype=dtype)
        cap = _capacity(nbytes)
        try:
            block = self._free.setdefault(cap, []).pop()
            self._kept -= cap
        except IndexError:
            block = np.empty(cap, dtype=np.uint8)
        # an array over a buffer view, not a slice of ``block``: every view of it (a reshape, a slice, a
        # view of those) has it as ``base`` (numpy collapses bases down to it, never past it to block)
        owner = np.frombuffer(memoryview(block), dtype=dtype, count=count)
        weakref.finalize(owner, self._give_back, block).atexit = False
        return owner.reshape(shape)

    def _give_back(self, block: np.ndarray) -> None:
        if self._kept + len(block) <= self._keep_bytes:
            self._kept += len(block)
            self._free.setdefault(len(block), []).append(block)


BATCHES = BufferPool()  # what the datasets' get_batch returns lives in it


def concatenate(parts: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate(parts)`` (one axis-0 join of arrays alike but in length) into recycled memory."""
    out = BATCHES.empty((sum(len(p) for p in parts), *parts[0].shape[1:]), parts[0].dtype)
    return np.concatenate(parts, out=out)


def copy(array: np.ndarray) -> np.ndarray:
    """``np.array(array)`` into recycled memory."""
    out = BATCHES.empty(array.shape, array.dtype)
    np.copyto(out, array)
    return out
