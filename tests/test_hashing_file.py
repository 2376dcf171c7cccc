"""HashingFile: the file, its sha256 and md5 are those of the bytes handed to it, in both modes.

Batch mode (``reserve``) writes whole blocks with O_DIRECT where the file system takes it and
the unaligned rest through the page cache; these tests hold its bytes equal to the threaded
mode's for pieces of every awkward size, on the file system of the tests and on one that refuses
O_DIRECT, and show that buffers kept for reuse are never shared with forked processes.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

import shardsmith.core.fsutil as fsutil
from shardsmith.core.fsutil import HashingFile


def _pieces(seed: int, batch: int) -> list[bytes]:
    rng = random.Random(seed)
    sizes = [1, 17, 511, 512, 4095, 4096, 4097, batch - 1, batch, batch + 1, 3 * batch + 5]
    return [rng.randbytes(rng.choice(sizes + [rng.randint(1, 2 * batch)])) for _ in range(rng.randint(1, 40))]


def _write(path: Path, pieces: list[bytes], *, batch: int, seed: int) -> HashingFile:
    rng = random.Random(seed)
    f = HashingFile(path, md5=True, batch_bytes=batch)
    for piece in pieces:
        if rng.random() < 0.5:
            f.reserve(len(piece))[:] = piece
        else:
            f.write(piece)
    return f


@pytest.mark.parametrize("batch", [4096, 10_000, 1 << 16])
def test_batch_mode_writes_and_hashes_exactly_the_bytes(tmp_path, batch):
    for seed in range(8):
        pieces = _pieces(seed, batch)
        f = _write(tmp_path / f"b{seed}", pieces, batch=batch, seed=seed)
        sha = f.commit()
        expect = b"".join(pieces)
        assert (tmp_path / f"b{seed}").read_bytes() == expect
        assert sha == hashlib.sha256(expect).hexdigest()
        assert f.md5 == hashlib.md5(expect).hexdigest()
        assert f.bytes == len(expect)
        threaded = HashingFile(tmp_path / f"t{seed}", md5=True)
        for piece in pieces:
            threaded.write(piece)
        assert threaded.commit() == sha
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{c}{s}" for c in "bt" for s in range(8))


def test_batch_mode_without_o_direct(tmp_path, monkeypatch):
    """A file system that refuses O_DIRECT at open, or takes it at open and refuses the write."""
    real_open = os.open
    pieces = _pieces(3, 8192)
    expect = b"".join(pieces)

    def refuse_at_open(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(fsutil.os, "open", refuse_at_open)
    f = _write(tmp_path / "a", pieces, batch=8192, seed=3)
    assert f.commit() == hashlib.sha256(expect).hexdigest()
    assert (tmp_path / "a").read_bytes() == expect
    monkeypatch.undo()

    f = _write(tmp_path / "b", pieces, batch=8192, seed=3)
    real_write = f._fh.write
    calls = []

    def refuse_direct_write(view: memoryview) -> int:
        calls.append(len(view))
        if f._direct:
            raise OSError(22, "Invalid argument")
        return real_write(view)

    f._fh = type("Raw", (), {"write": staticmethod(refuse_direct_write), "fileno": f._fh.fileno,
                            "flush": f._fh.flush, "close": f._fh.close})()
    assert f.commit() == hashlib.sha256(expect).hexdigest()
    assert (tmp_path / "b").read_bytes() == expect
    assert calls


def test_abort_leaves_nothing_and_drops_queued_batches(tmp_path):
    f = HashingFile(tmp_path / "x", batch_bytes=4096)
    for _ in range(20):
        f.reserve(3000)[:] = b"y" * 3000
    f.abort()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_reused_buffers_are_not_shared_with_forked_processes(tmp_path):
    """Buffers a parent kept for reuse are inherited by its forked workers; each must get its own
    copy (a shared map would let two workers write into one buffer)."""
    warm = HashingFile(tmp_path / "warm", batch_bytes=1 << 16)
    for _ in range(8):
        warm.reserve(1 << 15)[:] = bytes(1 << 15)
    warm.commit()
    pids = []
    for child in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                data = bytes([child + 1]) * (1 << 15)
                f = HashingFile(tmp_path / f"c{child}", batch_bytes=1 << 16)
                for _ in range(64):
                    f.reserve(len(data))[:] = data
                code = 0 if f.commit() == hashlib.sha256(data * 64).hexdigest() else 2
            finally:
                os._exit(code)
        pids.append(pid)
    assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids] == [0, 0]
    for child in range(2):
        assert (tmp_path / f"c{child}").read_bytes() == bytes([child + 1]) * (1 << 21)
