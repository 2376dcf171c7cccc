"""The streaming loader's cache (``storage/cache.py``) on its own: real files and real locks, a fetch
that writes bytes it is given (the S3 side is in test_stream_loader.py)."""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
from pathlib import Path

import pytest

from shardsmith.errors import DatasetError
from shardsmith.storage import cache as cache_mod
from shardsmith.storage.cache import REHASH, Item, ShardCache


def item(data: bytes, calls: list[str] | None = None, name: str = "s3://b/d/train-000000.tar") -> Item:
    sha = hashlib.sha256(data).hexdigest()

    def fetch(dst) -> None:
        if calls is not None:
            calls.append(sha)
        dst.write(data[dst.tell():])

    return Item(sha256=sha, size=len(data), name=name, fetch=fetch)


def blob(n: int, seed: int) -> bytes:
    return hashlib.sha256(str(seed).encode()).digest() * (n // 32) + bytes(n % 32)


def read(cache: ShardCache, it: Item) -> bytes:
    fd = cache.open(it)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def test_lru_eviction_keeps_the_limit_and_spares_files_in_use(tmp_path):
    cache = ShardCache(root=tmp_path / "c", limit=5000)
    items = [item(blob(1000, k)) for k in range(8)]
    held = cache.open(items[0])  # in use (as a mapped shard is): never evicted
    for it in items[1:]:
        assert read(cache, it) == blob(1000, items.index(it))
        assert cache.usage() <= 5000
    assert cache.has(items[0]) and cache.has(items[-1])
    assert not cache.has(items[1])  # the least recently used went first
    os.close(held)
    assert read(cache, items[2]) == blob(1000, 2)  # fetched again after its eviction
    assert cache.downloads == 9 and cache.usage() <= 5000


def test_one_download_per_file_whatever_the_threads(tmp_path):
    cache = ShardCache(root=tmp_path / "c", limit=10**6)
    calls: list[str] = []
    it = item(blob(50_000, 1), calls)
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(read(ShardCache(root=tmp_path / "c", limit=10**6), it)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [it.sha256] and got == [blob(50_000, 1)] * 8
    assert cache.has(it)


def _cached(tmp_path, size: int, seed: int) -> tuple[ShardCache, Item, list[str], Path]:
    """A cache in ``tmp_path/c`` holding one file of ``size`` bytes, read once, and made writable
    (cached files are read-only) for a test to damage it; the item's fetches are counted in ``calls``."""
    cache = ShardCache(root=tmp_path / "c", limit=10**6)
    calls: list[str] = []
    it = item(blob(size, seed), calls)
    assert read(cache, it) == blob(size, seed)
    path = cache.path(it.sha256)
    path.chmod(0o644)
    return cache, it, calls, path


def test_corrupt_partial_and_killed_copies_are_never_trusted(tmp_path):
    cache, it, calls, path = _cached(tmp_path, 4000, 2)
    path.write_bytes(bytes(4000))  # same size, other bytes: its marker no longer vouches for it
    assert read(cache, it) == blob(4000, 2) and len(calls) == 2
    path.chmod(0o644)
    with open(path, "r+b") as fh:  # a partial copy
        fh.truncate(100)
    assert read(cache, it) == blob(4000, 2) and len(calls) == 3
    # a killed download: its temporary file is ignored, then cleaned when room is next made
    stale = tmp_path / "c" / "tmp" / f"{'0' * 64}.99999.dead"
    stale.write_bytes(bytes(3000))
    assert read(cache, item(blob(10, 3))) == blob(10, 3)
    assert not stale.exists()


def test_bad_sha256_is_one_line_and_leaves_nothing(tmp_path):
    cache = ShardCache(root=tmp_path / "c", limit=10**6)
    good = item(blob(3000, 4))
    bad = Item(sha256=good.sha256, size=good.size, name=good.name, fetch=lambda dst: dst.write(blob(3000, 5)))
    with pytest.raises(DatasetError) as err:
        cache.open(bad)
    assert "\n" not in str(err.value) and "sha256" in str(err.value) and good.name in str(err.value)
    assert not cache.path(good.sha256).exists() and not os.listdir(tmp_path / "c" / "tmp")


def test_a_file_larger_than_the_limit_is_one_line_naming_both(tmp_path):
    cache = ShardCache(root=tmp_path / "c", limit=1000)
    with pytest.raises(DatasetError, match=r"train-000000\.tar.*2000 bytes.*cache_limit.*1000 bytes") as err:
        cache.open(item(blob(2000, 6)))
    assert "\n" not in str(err.value)


def test_a_folder_shared_by_processes_with_different_limits(tmp_path):
    big = ShardCache(root=tmp_path / "c", limit=6000)
    small = ShardCache(root=tmp_path / "c", limit=3000)
    for k in range(5):
        read(big, item(blob(1000, k)))
    assert 5000 <= big.usage() <= 6000  # the larger limit's user filled it
    read(small, item(blob(1000, 9)))
    assert small.usage() <= 3000  # the smaller one evicts down to its own when it adds a file
    assert small.has(item(blob(1000, 9)))


def test_the_cache_pickles_as_its_configuration(tmp_path):
    cache = ShardCache(root=tmp_path / "c", limit=1234)
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.root, copy.limit, copy.downloads) == (Path(tmp_path / "c"), 1234, 0)
    assert pickle.dumps(cache) == pickle.dumps(copy)


# -- at rest and under races (issue 26) --------------------------------------------------------------


def test_cached_files_are_read_only(tmp_path):
    cache = ShardCache(root=tmp_path / "c", limit=10**6)
    it = item(blob(3000, 7))
    assert read(cache, it) == blob(3000, 7)
    assert cache.path(it.sha256).stat().st_mode & 0o777 == 0o444


def test_a_file_changed_in_place_with_its_mtime_put_back_is_fetched_again(tmp_path):
    cache = ShardCache(root=tmp_path / "c", limit=10**8)
    calls: list[str] = []
    it = item(blob(REHASH + 4096, 8), calls)  # larger than REHASH: only the marker guards it
    assert read(cache, it) == blob(REHASH + 4096, 8)
    path = cache.path(it.sha256)
    st = path.stat()
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:  # one byte flipped in place, as a stray writer (or root) would
        fh.seek(100)
        fh.write(bytes([blob(REHASH + 4096, 8)[100] ^ 0xFF]))
    os.chmod(path, 0o444)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # size, inode and mtime as before
    assert (path.stat().st_size, path.stat().st_ino, path.stat().st_mtime_ns) == (st.st_size, st.st_ino,
                                                                                  st.st_mtime_ns)
    assert read(ShardCache(root=tmp_path / "c", limit=10**8), it) == blob(REHASH + 4096, 8)
    assert len(calls) == 2


def test_bit_rot_in_a_small_file_is_seen_by_a_new_process(tmp_path):
    cache, it, calls, path = _cached(tmp_path, 5000, 9)
    path.write_bytes(bytes(5000))
    # the marker rewritten to vouch for the rotten bytes: what a flip below the file system looks like
    (path.parent / f"{it.sha256}.ok").write_text(cache_mod._marker(path.stat()))
    assert read(ShardCache(root=tmp_path / "c", limit=10**6), it) == blob(5000, 9)  # a new process re-hashes
    assert len(calls) == 2


def test_a_cached_file_removed_between_the_look_and_the_open_is_fetched_again(tmp_path, monkeypatch):
    cache = ShardCache(root=tmp_path / "c", limit=10**6)
    calls: list[str] = []
    it = item(blob(3000, 10), calls)
    assert read(cache, it) == blob(3000, 10)
    opens = cache_mod._open_file

    def cleaner_first(path):  # a /tmp cleaner removes the file after the marker was checked
        os.unlink(path)
        monkeypatch.setattr(cache_mod, "_open_file", opens)
        return opens(path)

    monkeypatch.setattr(cache_mod, "_open_file", cleaner_first)
    assert read(cache, it) == blob(3000, 10)
    assert len(calls) == 2


def test_a_removed_cache_folder_is_made_again(tmp_path):
    import shutil

    cache = ShardCache(root=tmp_path / "c", limit=10**6)
    assert read(cache, item(blob(300, 11))) == blob(300, 11)
    for sub in ("data", "tmp", "locks"):
        shutil.rmtree(tmp_path / "c" / sub)
    assert read(cache, item(blob(300, 12))) == blob(300, 12)
    assert read(cache, item(blob(300, 11))) == blob(300, 11)
