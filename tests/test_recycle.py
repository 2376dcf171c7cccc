"""core.recycle: batch memory is reused once every array over it is gone, never while one lives."""

from __future__ import annotations

import numpy as np

from shardsmith.core.recycle import BufferPool, copy


def test_memory_comes_back_only_when_every_view_is_gone():
    pool = BufferPool()
    a = pool.empty((300, 100), np.float32)
    a[...] = 1
    address = a.ctypes.data
    view = a[3:5].reshape(-1)[::2]  # a view of a view: its base chain ends at the pool's array
    del a
    b = pool.empty((300, 100), np.float32)
    assert b.ctypes.data != address  # the view still holds the first block
    b[...] = 2
    assert np.all(view == 1)
    del view
    c = pool.empty((290, 100), np.float32)  # about the same size: the first block again
    assert c.ctypes.data == address and c.flags.writeable and c.flags.c_contiguous


def test_small_and_huge_arrays_are_plain_and_the_kept_memory_is_bounded():
    pool = BufferPool(keep_bytes=1 << 20)
    small = pool.empty((10,), np.int64)
    assert small.base is None  # malloc's bins keep small blocks anyway
    blocks = [pool.empty((300_000,), np.uint8) for _ in range(8)]
    del blocks
    assert pool._kept <= 1 << 20


def test_copy_is_an_equal_writable_array():
    src = np.arange(40_000, dtype=np.int32).reshape(-1, 4)[::1]
    out = copy(src)
    assert np.array_equal(out, src) and out.dtype == src.dtype and out.flags.writeable
    assert not np.shares_memory(out, src)
