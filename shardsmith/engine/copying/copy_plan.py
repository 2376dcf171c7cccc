"""The copy mode's plan (``engine/copying/image_copy.py``), made from a listing on disk in bounded memory:
each split's files in output order, and where its shards start.

Output order is the general path's: a split's samples sorted by ``(key, input order)`` (``kit/keys.py``
``place``), shards cut by the format's own rollover rule. Here it is an external sort by ranges of
keys: one pass over the listing (``CHUNK`` files at a time) puts each file, with its key, in the
bucket of its split and key range; then each bucket, in key order, is sorted in memory and
appended to its split's *ordered listing* (``core/file_listing.py``), while the rollover, carried
from bucket to bucket, finds the shard boundaries. Buckets are key ranges of ``bucket_files`` files
or so: shuffle keys are uniform, so the top bits of a key name its bucket; unshuffled keys are the
input order, so a file's place names it. A worker then reads its shard's rows of the ordered
listing, nothing else. What the parent holds is one chunk, one bucket, and a record per shard.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.file_listing import CHUNK, ROW, FileListing, ListingWriter, cut, decode
from shardsmith.core.input_file import InputFile
from shardsmith.kit import keys as keymod
from shardsmith.kit.file_copy import FileCopier, FileShard
from shardsmith.kit.rollover import Rollover

BUCKET_FILES = 1 << 16  # files sorted in memory at a time (~15 MB with their paths)
_KEY = np.dtype("<u8")
_LEN = np.dtype("<i8")


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyShard:
    """One planned shard: rows ``[start, stop)`` of its split's ordered listing."""

    split: str
    index: int
    name: str
    start: int
    stop: int
    nbytes: int  # of its files


@dataclass(frozen=True, kw_only=True)
class CopyPlan:
    """Every split's ordered listing and shards (a split without files has no shards)."""

    out_dir: str
    ordered: dict[str, FileListing]
    shards: dict[str, list[CopyShard]]
    folder: Path  # where it lies (removed with the scratch folder)

    def files(self, shard: CopyShard) -> FileShard:
        """The shard with its files, read from its split's ordered listing."""
        return FileShard(out_dir=self.out_dir, split=shard.split, index=shard.index, name=shard.name,
                         files=self.ordered[shard.split].rows(shard.start, shard.stop))

    def all_shards(self) -> list[CopyShard]:
        return [s for split in self.shards.values() for s in split]


def plan_copy(files: FileListing, *, copier: FileCopier, seed: int, shuffle: bool,
              splits: tuple[tuple[str, float], ...], out_dir: Path, folder: Path,
              bucket_files: int = BUCKET_FILES) -> CopyPlan:
    """Each split's shards, as the general path would cut them (``files``: in index order)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    n = len(files)
    bits = (max(1, -(-n // bucket_files)) - 1).bit_length()  # 2**bits buckets of about bucket_files files
    texts = ("rel",) if files.prefix is not None else ("rel", "path")
    buckets = _Buckets(folder, texts)
    for start in range(0, n, CHUNK):
        rows, packed = files.packed(start, min(n, start + CHUNK))
        split, keys, _ = keymod.place(seed=seed, shuffle=shuffle, splits=splits, paths=decode(*packed["rel"]),
                                      records=np.zeros(len(rows), dtype=np.int64), file_index=rows["index"])
        if not bits:
            bucket = np.zeros(len(rows), dtype=np.int64)
        elif shuffle:
            bucket = (keys >> np.uint64(64 - bits)).astype(np.int64)
        else:  # keys are the input order, which is the listing's
            bucket = (np.arange(start, start + len(rows), dtype=np.int64) << bits) // n
        # the chunk's files grouped by (split, bucket), in their order within each: one cut of the
        # paths, then each group a contiguous run of them
        group = split.astype(np.int64) << bits | bucket
        order = np.argsort(group, kind="stable")
        group, keys, rows = group[order], keys[order], rows[order]
        moved = {t: cut(*packed[t], order) for t in texts}
        edges = np.flatnonzero(np.diff(group)) + 1
        for a, z in zip([0, *edges.tolist()], [*edges.tolist(), len(group)]):
            g = int(group[a])
            buckets.add(g >> bits, g & ((1 << bits) - 1), keys[a:z], rows[a:z],
                        {t: _run_of(*moved[t], a, z) for t in texts})
    ordered: dict[str, FileListing] = {}
    shards: dict[str, list[CopyShard]] = {}
    for s, (name, _) in enumerate(splits):
        writer = ListingWriter(folder=folder / f"split-{s}", prefix=files.prefix)
        roller = Rollover(max_weight=copier.max_weight, max_samples=copier.max_samples)
        bounds, offsets = [0], [0]  # shard starts (then the end) and the bytes before each
        before = 0  # the split's bytes in earlier buckets
        for b in range(1 << bits):
            keys, rows, packed = buckets.take(s, b)
            if not len(rows):
                continue
            order = np.lexsort((rows["index"], keys))  # ``keys.output_order``: by key, ties in input order
            rows = rows[order]
            first = writer.count
            writer.append(rows, {t: cut(*packed[t], order) for t in texts}, files.groups)
            ends = np.cumsum(rows["size"])
            for at in roller.cut(copier.weights(rows["size"])):
                bounds.append(first + at)
                offsets.append(before + (int(ends[at - 1]) if at else 0))
            before += int(ends[-1])
        if writer.count:
            bounds.append(writer.count)
            offsets.append(before)
        ordered[name] = writer.close()
        shards[name] = [CopyShard(split=name, index=i, name=copier.shard_name(name, i), start=a, stop=z,
                                  nbytes=offsets[i + 1] - offsets[i])
                        for i, (a, z) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return CopyPlan(out_dir=str(out_dir), ordered=ordered, shards=shards, folder=folder)


def _run_of(blob: bytes, lengths: np.ndarray, a: int, z: int) -> tuple[bytes, np.ndarray]:
    """Strings ``[a, z)`` of an encoded blob."""
    first = int(lengths[:a].sum())
    return blob[first:first + int(lengths[a:z].sum())], lengths[a:z]


class _Buckets:
    """Each (split, key range)'s files as they come: keys, ``ROW`` records, and text columns (blob
    and lengths), appended to files of their own."""

    def __init__(self, folder: Path, texts: tuple[str, ...]) -> None:
        self.folder, self.texts = folder, texts

    def _path(self, s: int, b: int, what: str) -> Path:
        return self.folder / f"b{s}-{b}.{what}"

    def add(self, s: int, b: int, keys: np.ndarray, rows: np.ndarray, packed: dict[str, tuple[bytes, np.ndarray]]
            ) -> None:
        parts: list[tuple[str, bytes]] = [("key", keys.astype(_KEY).tobytes()), ("row", rows.astype(ROW).tobytes())]
        for t in self.texts:
            blob, lengths = packed[t]
            parts += [(f"{t}.bin", blob), (f"{t}.len", lengths.astype(_LEN).tobytes())]
        for what, data in parts:
            with open(self._path(s, b, what), "ab") as fh:
                fh.write(data)

    def take(self, s: int, b: int) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[bytes, np.ndarray]]]:
        """A bucket's files (none if it got none), its files on disk removed."""
        if not self._path(s, b, "key").is_file():
            return np.empty(0, dtype=_KEY), np.empty(0, dtype=ROW), {}
        keys = np.fromfile(self._path(s, b, "key"), dtype=_KEY)
        rows = np.fromfile(self._path(s, b, "row"), dtype=ROW)
        packed = {t: (self._path(s, b, f"{t}.bin").read_bytes(), np.fromfile(self._path(s, b, f"{t}.len"), dtype=_LEN))
                  for t in self.texts}
        for what in ("key", "row", *(f"{t}.{x}" for t in self.texts for x in ("bin", "len"))):
            with contextlib.suppress(FileNotFoundError):
                self._path(s, b, what).unlink()
        return keys, rows, packed


def as_listing(files: Any, *, folder: Path) -> FileListing:
    """The copy mode's files as a listing in index order: a listing on disk as it is, a list
    written as one (``--balance`` narrows the listing to a list)."""
    if isinstance(files, FileListing):
        return files
    ordered: list[InputFile] = sorted(files, key=lambda f: f.index)
    return FileListing.of(ordered, folder=folder)

