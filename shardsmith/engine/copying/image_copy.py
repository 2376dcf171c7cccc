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
import gc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shardsmith.core.input_file import InputFile
from shardsmith.core.memory import no_gc
from shardsmith.engine.copying import copy_plan
from shardsmith.engine.copying.copy_plan import CopyPlan, CopyShard, as_listing, plan_copy
from shardsmith.engine.output.outdir import finish_output, work_path
from shardsmith.engine.output.resume import die_with_parent
from shardsmith.engine.processes.workers import worker_pool
from shardsmith.engine.shuffle.run import Converted
from shardsmith.engine.shuffle.scatter import TaskResult
from shardsmith.engine.shuffle.split_gather import SplitOutput
from shardsmith.kit.file_copy import FileCopier, FileShard, ImageSamples
from shardsmith.kit.writer import ShardRecord

PLAN = "copy-plan"  # the plan's folder in the scratch folder (removed with it)


def copy_files(files: Sequence[InputFile], *, copier: FileCopier, images: ImageSamples, seed: int, shuffle: bool,
               splits: tuple[tuple[str, float], ...], workers: int, out_dir: Path, progress: Any) -> Converted:
    """Every split's shards planned from the listing and written by workers; what ``convert_all`` returns."""
    with no_gc():
        plan = plan_shards(files, copier=copier, seed=seed, shuffle=shuffle, splits=splits, out_dir=out_dir)
    with progress.bar(total=sum(s.nbytes for s in plan.all_shards()), desc="convert", unit="B") as bar:
        shards = write_all(plan, copier=copier, images=images, workers=workers, progress=bar.update,
                           out_dir=out_dir)
    return Converted(results=[TaskResult(task=0, records=len(files))],
                     outputs={name: SplitOutput(shards=s) for name, s in shards.items()})


def plan_shards(files: Sequence[InputFile], *, copier: FileCopier, seed: int, shuffle: bool,
                splits: tuple[tuple[str, float], ...], out_dir: Path, bucket_files: int | None = None) -> CopyPlan:
    """Each split's shards, as the general path would cut them: samples by (key, input order), rolled
    over by the format's own rule (``copier.max_weight``, ``copier.max_samples``); planned on disk in
    the scratch folder (``engine/copying/copy_plan.py``)."""
    folder = work_path(out_dir) / PLAN
    listing = as_listing(files, folder=folder.with_name(PLAN + "-files"))
    return plan_copy(listing, copier=copier, seed=seed, shuffle=shuffle, splits=splits, out_dir=out_dir,
                     folder=folder, bucket_files=bucket_files or copy_plan.BUCKET_FILES)


class _Shared:
    """What every worker needs (the format's copier, the sample builder, the plan: a few records
    per shard, the files on disk), inherited through fork or sent once."""

    copier: FileCopier | None = None
    images: ImageSamples | None = None
    plan: CopyPlan | None = None


def _init(copier: FileCopier, images: ImageSamples, plan: CopyPlan, worker: bool = False) -> None:
    if worker:
        die_with_parent()
        gc.freeze()  # the parent's objects are never garbage: collections skip them
    _Shared.copier, _Shared.images, _Shared.plan = copier, images, plan


def _write(shard: CopyShard) -> tuple[ShardRecord, Any]:
    """A shard of the plan: its files read from its split's ordered listing (only the shard's
    record crosses the pipe), then written whole by the format."""
    assert _Shared.copier is not None and _Shared.images is not None and _Shared.plan is not None
    return _Shared.copier.write(_Shared.plan.files(shard), _Shared.images)


def write_all(plan: CopyPlan, *, copier: FileCopier, images: ImageSamples, workers: int,
              progress: Callable[[int], None], out_dir: Path) -> dict[str, list[ShardRecord]]:
    """Every planned shard, largest first across ``workers`` processes; then each split's own files."""
    shards = plan.all_shards()
    done: dict[tuple[str, int], tuple[ShardRecord, Any]] = {}
    try:
        if workers <= 1 or len(shards) <= 1:
            _init(copier, images, plan)
            for shard in shards:
                done[(shard.split, shard.index)] = _write(shard)
                progress(shard.nbytes)
        else:
            _run_pool(shards, plan=plan, copier=copier, images=images, workers=workers, done=done, progress=progress)
    except KeyboardInterrupt:
        raise
    except BaseException:
        _remove(plan, copier)
        finish_output(out_dir)  # a failed run blocks no other command
        raise
    out: dict[str, list[ShardRecord]] = {}
    for name, split_shards in plan.shards.items():
        written = [done[(name, shard.index)] for shard in split_shards]
        copier.finish_split(out_dir, name, written)  # an empty split too: the manifest names it
        out[name] = [r for r, _ in written]
    return out


def _run_pool(shards: list[CopyShard], *, plan: CopyPlan, copier: FileCopier, images: ImageSamples, workers: int,
              done: dict[tuple[str, int], tuple[ShardRecord, Any]], progress: Callable[[int], None]) -> None:
    with worker_pool(min(workers, len(shards)), initializer=_init, initargs=(copier, images, plan, True),
                     advice="try fewer --workers") as pool:
        # the biggest shards first, so the last one to finish is a small one
        futures = {pool.submit(_write, shard): shard for shard in sorted(shards, key=lambda s: -s.nbytes)}
        for future, shard in futures.items():
            done[(shard.split, shard.index)] = future.result()
            progress(shard.nbytes)


def _remove(plan: CopyPlan, copier: FileCopier) -> None:
    """A failed run leaves none of its shards behind."""
    for shard in plan.all_shards():
        named = FileShard(out_dir=plan.out_dir, split=shard.split, index=shard.index, name=shard.name, files=())
        for name in copier.shard_files(named):
            with contextlib.suppress(FileNotFoundError):
                (Path(plan.out_dir) / name).unlink()
