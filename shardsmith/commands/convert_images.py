"""The one-pass path of ``convert`` for an image folder whose images go into the tar unchanged.

The shuffle order (a hash of the seed and each path) and every sample's size (from the listing)
are known before any image is read, so the shards are planned straight away and written by
several threads, each image read once: checked, hashed and written. It yields exactly the bytes
of the general two-pass path. Where that cannot hold — ``--on-error skip`` (a skipped image would
move shard boundaries) or an image whose content is not what its suffix says — the caller uses
the general path instead (``Replan``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith import keys as keymod
from shardsmith.errors import DataError
from shardsmith.inputs import InputFile
from shardsmith.sample import Identity
from shardsmith.splits import assign_splits
from shardsmith.tarfmt import member_header, sample_members
from shardsmith.writers.webdataset import SourceRef, TarWriter

BATCH = 4096


class Replan(Exception):
    """This folder needs the general two-pass path."""


def suffix_ext(path: str) -> str:
    ext = Path(path).suffix.lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext


def write_image_folder(files: list[InputFile], classes: list[str], *, out: Path, seed: int, shuffle: bool,
                       splits: tuple[tuple[str, float], ...], check_images: str, shard_samples: int | None,
                       shard_bytes: int, wids_md5: bool, threads: int) -> dict[str, TarWriter]:
    """Every split's shards, closed; raises DataError for a bad image and Replan as said above."""
    from shardsmith.images import ImageError, canonical_ext, check_image

    rels = [f.rel for f in files]
    zeros = np.zeros(len(files), dtype=np.int64)
    index = np.fromiter((f.index for f in files), dtype=np.int64, count=len(files))
    order = keymod.orders_for(index, zeros)
    keys = keymod.keys_for(f"shuffle:{seed}", rels, zeros) if shuffle else order
    draws = (keymod.keys_for("split", rels, zeros) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    split_of = assign_splits(draws, dict(splits))
    labels = {name: str(i).encode() for i, name in enumerate(classes)}
    by_index = {f.index: f for f in files}
    sources = [""] * (max(by_index) + 1)
    for f in files:
        sources[f.index] = f.path

    def check(i: int, data: bytes) -> None:
        f = by_index[i]
        try:
            info = check_image(data, level=check_images)
        except ImageError as exc:
            raise DataError(file=f.rel, reason=str(exc)) from None
        if info is not None and canonical_ext(info.format) != suffix_ext(f.path):
            raise Replan(f"{f.rel} holds {info.format}")

    writers: dict[str, TarWriter] = {}
    for s, (name, _) in enumerate(splits):
        mine = np.flatnonzero(split_of == s)
        mine = mine[np.lexsort((order[mine], keys[mine]))]
        writer = TarWriter(out_dir=out, split=name, shard_samples=shard_samples, shard_bytes=shard_bytes,
                           wids_md5=wids_md5, sources=sources, threads=threads, check=check)
        try:
            for lo in range(0, len(mine), BATCH):
                pieces: list[Any] = []
                lengths = []
                for i in mine[lo:lo + BATCH].tolist():
                    f = files[i]
                    key = Identity(f.rel, 0).key()
                    members = [member_header(f"{key}.{suffix_ext(f.path)}", f.size),
                               SourceRef(index=f.index, size=f.size).pack(),
                               *sample_members(key, [("cls", labels[f.group])])]
                    pieces += members
                    lengths.append(sum(len(m) for m in members))
                writer.write_batch(np.asarray(lengths, dtype=np.int64), memoryview(b"".join(pieces)))
            writer.close()
        except BaseException:
            writer.abort()
            raise
        writers[name] = writer
    return writers
