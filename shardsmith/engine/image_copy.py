"""The engine's copy mode: whole input files (unaugmented images) into shards with no shuffle pass.

An image's sample is its file's bytes plus a label, and its key, split and size are known from the
listing: the whole output (order, shard boundaries) follows without reading a byte. So there is no
scatter and no spill: the shards are planned here, each worker takes whole shards and the format's
``FileCopier`` writes each one. The bytes are those of the general shuffle path (a test holds them
equal); a bad image stops the run (``--on-error fail``), which is why ``skip`` takes the general
path, where a skipped image moves the shard boundaries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.input_file import InputFile
from shardsmith.core.memory import no_gc
from shardsmith.core.packed_files import PackedFiles
from shardsmith.engine.outdir import finish_output
from shardsmith.engine.resume import die_with_parent
from shardsmith.engine.run import Converted
from shardsmith.engine.scatter import TaskResult
from shardsmith.engine.split_gather import SplitOutput
from shardsmith.engine.workers import worker_pool
from shardsmith.kit import keys as keymod
from shardsmith.kit.file_copy import FileCopier, FileShard, ImageSamples
from shardsmith.kit.rollover import shard_bounds
from shardsmith.kit.writer import ShardRecord

Plans = dict[str, list[FileShard]]


def copy_files(files: list[InputFile], *, copier: FileCopier, images: ImageSamples, seed: int, shuffle: bool,
               splits: tuple[tuple[str, float], ...], workers: int, out_dir: Path, progress: Any) -> Converted:
    """Every split's shards planned from the listing and written by workers; what ``convert_all`` returns."""
    with no_gc():
        plans = plan_shards(files, copier=copier, seed=seed, shuffle=shuffle, splits=splits, out_dir=out_dir)
    with progress.bar(total=sum(f.size for f in files), desc="convert", unit="B") as bar:
        shards = write_all(plans, copier=copier, images=images, workers=workers, progress=bar.update,
                           out_dir=out_dir)
    return Converted(results=[TaskResult(task=0, records=len(files))],
                     outputs={name: SplitOutput(shards=s) for name, s in shards.items()})


def plan_shards(files: list[InputFile], *, copier: FileCopier, seed: int, shuffle: bool,
                splits: tuple[tuple[str, float], ...], out_dir: Path) -> Plans:
    """Each split's shards, as the general path would cut them: samples by (key, input order), rolled
    over by the format's own rule (``copier.max_weight``, ``copier.max_samples``)."""
    rels = [f.rel for f in files]
    records = np.zeros(len(files), dtype=np.int64)
    index = np.fromiter((f.index for f in files), dtype=np.int64, count=len(files))
    split, keys, order = keymod.place(seed=seed, shuffle=shuffle, splits=splits, paths=rels, records=records,
                                      file_index=index)
    perm = keymod.output_order(keys, order)
    weights = copier.weights(np.fromiter((f.size for f in files), dtype=np.int64, count=len(files)))
    plans: Plans = {}
    for s, (name, _) in enumerate(splits):
        members = perm[split[perm] == s]
        bounds = shard_bounds(weights[members], max_weight=copier.max_weight,
                              max_samples=copier.max_samples).tolist()
        plans[name] = [FileShard(out_dir=str(out_dir), split=name, index=i, name=copier.shard_name(name, i),
                                 files=tuple([files[j] for j in members[a:b].tolist()]))
                       for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return plans


class _Shared:
    """What every worker needs (the format's copier, the sample builder, the plan), inherited
    through fork or sent once."""

    copier: FileCopier | None = None
    images: ImageSamples | None = None
    # each shard without its files, and where they lie in ``files`` (set once per process)
    shards: dict[tuple[str, int], tuple[FileShard, int, int]] = {}  # noqa: RUF012
    files: PackedFiles | None = None


def _init(copier: FileCopier, images: ImageSamples, worker: bool = False,
          shards: dict[tuple[str, int], tuple[FileShard, int, int]] | None = None,
          files: PackedFiles | None = None) -> None:
    if worker:
        die_with_parent()
        gc.freeze()  # the parent's objects (the whole listing) are never garbage: collections skip them
    _Shared.copier, _Shared.images, _Shared.shards, _Shared.files = copier, images, shards or {}, files


def _write(shard: FileShard) -> tuple[ShardRecord, Any]:
    assert _Shared.copier is not None and _Shared.images is not None
    return _Shared.copier.write(shard, _Shared.images)


def _write_planned(split: str, index: int) -> tuple[ShardRecord, Any]:
    """In a worker: a shard of the plan it was started with. Only the shard's name crosses the
    pipe: pickling its ten thousand file entries took longer than writing a small shard. Its files
    are rebuilt from the packed listing, which the worker only reads (``core/packed_files.py``)."""
    assert _Shared.files is not None
    shard, start, stop = _Shared.shards[(split, index)]
    return _write(dataclasses.replace(shard, files=_Shared.files.take(start, stop)))


def write_all(plans: Plans, *, copier: FileCopier, images: ImageSamples, workers: int,
              progress: Callable[[int], None], out_dir: Path) -> dict[str, list[ShardRecord]]:
    """Every planned shard, largest first across ``workers`` processes; then each split's own files."""
    shards = [shard for split_shards in plans.values() for shard in split_shards]
    done: dict[tuple[str, int], tuple[ShardRecord, Any]] = {}
    try:
        if workers <= 1 or len(shards) <= 1:
            _init(copier, images)
            for shard in shards:
                done[(shard.split, shard.index)] = _write(shard)
                progress(shard.nbytes)
        else:
            _run_pool(shards, copier=copier, images=images, workers=workers, done=done, progress=progress)
    except KeyboardInterrupt:
        raise
    except BaseException:
        _remove(plans, copier)
        finish_output(out_dir)  # a failed run blocks no other command
        raise
    out: dict[str, list[ShardRecord]] = {}
    for name, split_shards in plans.items():
        written = [done[(name, shard.index)] for shard in split_shards]
        copier.finish_split(out_dir, name, written)  # an empty split too: the manifest names it
        out[name] = [r for r, _ in written]
    return out


def _run_pool(shards: list[FileShard], *, copier: FileCopier, images: ImageSamples, workers: int,
              done: dict[tuple[str, int], tuple[ShardRecord, Any]], progress: Callable[[int], None]) -> None:
    # inherited through fork, or sent once: the files as arrays, so that workers copy none of the listing
    files = PackedFiles.of([f for shard in shards for f in shard.files])
    plan, start = {}, 0
    for shard in shards:
        plan[(shard.split, shard.index)] = (dataclasses.replace(shard, files=()), start, start + len(shard.files))
        start += len(shard.files)
    with worker_pool(min(workers, len(shards)), initializer=_init, initargs=(copier, images, True, plan, files),
                     advice="try fewer --workers") as pool:
        # the biggest shards first, so the last one to finish is a small one
        futures = {pool.submit(_write_planned, shard.split, shard.index): shard
                   for shard in sorted(shards, key=lambda s: -s.nbytes)}
        for future, shard in futures.items():
            done[(shard.split, shard.index)] = future.result()
            progress(shard.nbytes)


def _remove(plans: Plans, copier: FileCopier) -> None:
    """A failed run leaves none of its shards behind."""
    for split_shards in plans.values():
        for shard in split_shards:
            for name in copier.shard_files(shard):
                with contextlib.suppress(FileNotFoundError):
                    (Path(shard.out_dir) / name).unlink()
