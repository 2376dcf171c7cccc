"""Image files unchanged into tar shards: the webdataset side of the engine's copy mode
(``engine/copying/image_copy.py``, which plans the shards from the listing and runs the workers).

Without augmentation an image's tar sample is its file's bytes plus a label, so a shard is
written in one pass: each image read straight into its place after its header, checked there,
and hashed and written with its neighbours — one read and one write per image, like ``tar cf``.
The bytes are those of the general shuffle path (a test holds them equal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.faults import crash_point
from shardsmith.core.fsutil import HashingFile
from shardsmith.core.input_file import InputFile
from shardsmith.errors import DataError
from shardsmith.formats.webdataset.tarfmt import (
    _CONST_SUM,
    _HEAD,
    _HEADER,
    _MID,
    _TAIL,
    _ZEROS,
    BLOCK,
    MAX_NAME,
    MAX_SIZE,
    index_array,
    member_header,
)
from shardsmith.formats.webdataset.writer import finish_shard, max_tar_weight, offsets_name, write_wids
from shardsmith.kit.file_copy import FileShard, ImageSamples
from shardsmith.kit.writer import ShardRecord

_CLS_BYTES = 2 * BLOCK  # the label member: a header and one block of digits


@dataclass(frozen=True, kw_only=True)
class TarCopier:
    """Tar shards of unchanged images (``kit.file_copy.FileCopier``), rolled over by the tar writers' rule."""

    shard_samples: int | None
    shard_bytes: int
    wids_md5: bool

    @property
    def max_weight(self) -> int:
        return max_tar_weight(self.shard_bytes)  # within the bytes that keep a closed shard under shard_bytes

    @property
    def max_samples(self) -> int | None:
        return self.shard_samples

    def weights(self, sizes: np.ndarray) -> np.ndarray:
        return BLOCK + (sizes + BLOCK - 1) // BLOCK * BLOCK + _CLS_BYTES  # header, data, padding, label

    def shard_name(self, split: str, index: int) -> str:
        return f"{split}-{index:06d}.tar"

    def shard_files(self, shard: FileShard) -> list[str]:
        return [shard.name, offsets_name(shard.name)]

    def write(self, shard: FileShard, samples: ImageSamples) -> tuple[ShardRecord, Any]:
        return write_shard(shard, samples, md5=self.wids_md5)

    def finish_split(self, out_dir: Path, split: str, written: list[tuple[ShardRecord, Any]]) -> None:
        write_wids(out_dir, split, [r for r, _ in written], [m for _, m in written])


# Each sample is built in place in the shard's batch buffer: the image is read straight into its
# place after its header and checked there, and a full batch is hashed and written from there
# (HashingFile's batch mode). 4 MiB keeps a batch near the CPU caches from the read to the write.
BATCH_BYTES = 4 << 20


def write_shard(job: FileShard, images: ImageSamples, *, md5: bool) -> tuple[ShardRecord, str | None]:
    """Read, check and append each image of the shard, hashing as it goes; commit it whole."""
    out = Path(job.out_dir)
    tar = HashingFile(out / job.name, md5=md5, batch_bytes=BATCH_BYTES)
    dirs = _Dirs()
    try:
        files = job.files
        keys = images.image_keys(files)  # what does not need the bytes, for the whole shard at once
        labels = images.image_labels(files)
        ext_of = images.image_ext
        starts: list[int] = []
        exts: list[str] = []
        reserve = tar.reserve
        for f, key, label in zip(files, keys, labels):
            size = f.size
            body = size + (-size % BLOCK)  # the image and its padding
            starts.append(tar.bytes)
            view = reserve(BLOCK + body + _CLS_BYTES)
            data = view[BLOCK:BLOCK + size]
            read_into(f, data, dirs)
            ext = ext_of(f, data)
            _members_around(view, key, ext, size, body, label)
            exts.append(ext)
        index = _index(starts, tar.bytes, [f.size for f in files], keys, exts, [len(b) for b in labels])
        done = finish_shard(tar, index, out)
        crash_point(f"shard:{job.split}:{job.index}")
        return done
    except BaseException:
        tar.abort()
        raise
    finally:
        dirs.close()


def _index(starts: list[int], end: int, sizes: list[int], keys: list[str], exts: list[str],
           labels: list[int]) -> np.ndarray:
    """The shard's offset index (``tarfmt.index_array``): each sample is the image, then its label."""
    n = len(starts)
    at = np.asarray(starts, np.int64)
    size = np.asarray(sizes, np.int64)
    data = np.empty(2 * n, np.int64)
    data[0::2] = at + BLOCK
    data[1::2] = at + 2 * BLOCK + size + (-size % BLOCK)
    sizes2 = np.empty(2 * n, np.int64)
    sizes2[0::2] = size
    sizes2[1::2] = labels
    names = ["cls"] * (2 * n)
    names[0::2] = exts
    return index_array([*starts, end], np.arange(0, 2 * n + 1, 2), data, sizes2, names, keys)


_pack_header = _HEADER.pack_into
_DOT, _CLS = sum(b"."), sum(b"cls")


def _members_around(view: memoryview, key: str, ext: str, size: int, body: int, label: bytes) -> None:
    """Around the image bytes already in place: its header and padding, then the label member;
    the bytes of ``member_header`` and ``sample_members``, packed straight into the buffer."""
    k = key.encode()
    e, e_sum = _EXTS.get(ext) or _ext_bytes(ext)
    if len(k) + 1 + max(len(e), 3) > MAX_NAME or b"\0" in k or size > MAX_SIZE or len(label) > BLOCK:
        member_header(f"{key}.{ext}", size)  # raises the reason
        member_header(f"{key}.cls", len(label))
        raise ValueError(f"sample {key!r}: label of {len(label)} bytes")
    cls = _LABELS.get(label) or _label_member(label)
    base = _CONST_SUM + sum(k) + _DOT
    field = b"%011o\0" % size
    _pack_header(view, 0, k + b"." + e, _HEAD, field, _MID, b"%06o\0 " % (base + e_sum + sum(field)), _TAIL)
    view[BLOCK + size:BLOCK + body] = _ZEROS[:body - size]
    field, field_sum, block = cls
    _pack_header(view, BLOCK + body, k + b".cls", _HEAD, field, _MID, b"%06o\0 " % (base + _CLS + field_sum), _TAIL)
    view[2 * BLOCK + body:] = block


_EXTS: dict[str, tuple[bytes, int]] = {}  # an image extension: its bytes and their sum
_LABELS: dict[bytes, tuple[bytes, int, bytes]] = {}  # a label: its size field, that field's sum, its data block


def _ext_bytes(ext: str) -> tuple[bytes, int]:
    e = ext.encode()
    _EXTS[ext] = (e, sum(e))
    return _EXTS[ext]


def _label_member(label: bytes) -> tuple[bytes, int, bytes]:
    field = b"%011o\0" % len(label)
    _LABELS[label] = (field, sum(field), label.ljust(BLOCK, b"\0"))
    return _LABELS[label]


class _Dirs:
    """Open folders of the images, so each image is opened by its name alone (no walk of the
    whole path per file)."""

    keep = 64  # folders held open at most: far below any fd limit

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def open(self, path: str) -> int:
        folder, _, name = path.rpartition("/")
        fd = self.fds.get(folder)
        if fd is None:
            # past ``keep`` folders (many classes), the others' images are opened by their whole
            # path: closing folders to open others would open a folder per image in shuffled order
            if len(self.fds) >= self.keep:
                return os.open(path, os.O_RDONLY)
            try:
                fd = self.fds[folder] = os.open(folder or "/", os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                return os.open(path, os.O_RDONLY)  # and let that fail with the image's own error
        return os.open(name, os.O_RDONLY, dir_fd=fd)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


_PROBE = bytearray(1)  # one byte past the known size: a file that grew is caught, not cut


def read_into(f: InputFile, view: memoryview, dirs: _Dirs | None = None) -> None:
    """Fill ``view`` (exactly ``f.size`` bytes) with the file's bytes; the file must still be that size.

    Each read asks for one byte more than the listed size is missing: a file cut since the listing
    comes back short, one that grew fills the probe byte. Either ends the run (DataError naming the
    file, not skippable: the input changed under us), as does an image listed empty that is not.
    This costs no system call beyond the reads themselves (an fstat would be one more per image).
    """
    got = 0
    try:
        fd = dirs.open(f.path) if dirs is not None else os.open(f.path, os.O_RDONLY)
        try:
            while n := os.readv(fd, [view[got:], _PROBE]):  # at least one read, an empty file too
                got += n
                if got >= f.size:
                    break
        finally:
            os.close(fd)
    except OSError as exc:
        # as the general path's reader makes it: a bad record, which --on-error skip skips
        raise DataError(file=f.rel, reason=f"cannot read: {exc.strerror or exc}", skippable=True) from None
    if got != f.size:
        size = f"more than {f.size} bytes" if got > f.size else f"{got} bytes"
        raise DataError(file=f.rel, reason=f"changed while converting: {size}, was {f.size}")
