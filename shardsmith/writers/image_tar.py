"""Zero-copy image folders into tar shards, planned from the listing alone, written shard by shard in workers.

Without augmentation an image's tar sample is its file's bytes plus a label, and its key, split
and size are known from the listing: the whole output (order, shard boundaries) follows without
reading a byte. So there is no scatter pass and no spill: each worker takes whole shards, reads
the images in output order, checks them, and writes and hashes the shard — one read and one
write per image, like ``tar cf``. The bytes are those of the general shuffle path (a test holds
them equal); a bad image stops the run (``--on-error fail``), which is why ``skip`` takes the
general path, where a skipped image moves the shard boundaries.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith import keys as keymod
from shardsmith.errors import DataError
from shardsmith.fsutil import HashingFile
from shardsmith.inputs import InputFile
from shardsmith.outdir import finish_output
from shardsmith.pipeline import worker_pool
from shardsmith.resume import crash_point, die_with_parent
from shardsmith.splits import assign_splits
from shardsmith.tarfmt import BLOCK, member_header, padding, sample_members
from shardsmith.writers.base import ShardRecord
from shardsmith.writers.webdataset import closed_size, finish_shard, write_wids

_CLS_BYTES = 2 * BLOCK  # the label member: a header and one block of digits


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to write: its files in output order."""

    out_dir: str
    split: str
    index: int
    files: tuple[InputFile, ...]
    wids_md5: bool

    @property
    def name(self) -> str:
        return f"{self.split}-{self.index:06d}.tar"

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.files)


def plan_shards(files: list[InputFile], *, seed: int, shuffle: bool, splits: tuple[tuple[str, float], ...],
                shard_samples: int | None, shard_bytes: int, out_dir: Path,
                wids_md5: bool) -> dict[str, list[ShardJob]]:
    """Each split's shards, as the general path would cut them: samples by (key, input order), rolled
    over at ``shard_samples`` or before ``shard_bytes`` (end-of-archive blocks included)."""
    rels = [f.rel for f in files]
    records = np.zeros(len(files), dtype=np.int64)
    split = assign_splits(keymod.split_draws(rels, records), dict(splits))
    order = keymod.input_order(np.fromiter((f.index for f in files), dtype=np.int64, count=len(files)), records)
    keys = keymod.shuffle_keys(seed, rels, records) if shuffle else order
    perm = np.lexsort((order, keys))
    limit = shard_samples or (1 << 62)
    plans: dict[str, list[ShardJob]] = {}
    for s, (name, _) in enumerate(splits):
        jobs: list[ShardJob] = []
        run: list[InputFile] = []
        size = 0
        for i in perm[split[perm] == s].tolist():
            f = files[i]
            true_size = BLOCK + f.size + len(padding(f.size)) + _CLS_BYTES
            if run and (len(run) >= limit or closed_size(size + true_size) > shard_bytes):
                jobs.append(ShardJob(out_dir=str(out_dir), split=name, index=len(jobs), files=tuple(run),
                                     wids_md5=wids_md5))
                run, size = [], 0
            run.append(f)
            size += true_size
        if run:
            jobs.append(ShardJob(out_dir=str(out_dir), split=name, index=len(jobs), files=tuple(run),
                                 wids_md5=wids_md5))
        plans[name] = jobs
    return plans


class _Shared:
    """What every worker needs (the sample builder), inherited through fork or sent once."""

    sample: Callable[[InputFile, bytes], tuple[str, str, bytes]] | None = None


def _init(sample: Callable[[InputFile, bytes], tuple[str, str, bytes]], worker: bool = False) -> None:
    if worker:
        die_with_parent()
    _Shared.sample = sample


def write_shard(job: ShardJob) -> tuple[ShardRecord, str | None]:
    """Read, check and append each image of the shard, hashing as it goes; commit it whole."""
    sample = _Shared.sample
    assert sample is not None
    out = Path(job.out_dir)
    tar = HashingFile(out / job.name, md5=job.wids_md5)
    try:
        starts: list[int] = []
        pieces: list[bytes] = []
        pending = 0
        for f in job.files:
            starts.append(tar.bytes + pending)
            data = read_whole(f)
            key, ext, label = sample(f, data)
            pad = padding(f.size)
            cls = sample_members(key, [("cls", label)])
            pieces += (member_header(f"{key}.{ext}", f.size), data, pad, *cls)
            pending += BLOCK + f.size + len(pad) + _CLS_BYTES
            if pending >= 4 << 20:
                tar.write(b"".join(pieces))
                pieces, pending = [], 0
        if pieces:
            tar.write(b"".join(pieces))
        done = finish_shard(tar, starts, out / job.name.replace(".tar", ".offsets.npy"))
        crash_point(f"shard:{job.split}:{job.index}")
        return done
    except BaseException:
        tar.abort()
        raise


def read_whole(f: InputFile) -> bytes:
    """The bytes of an input file of known size (raw syscalls: half the cost of ``open`` for small files)."""
    try:
        fd = os.open(f.path, os.O_RDONLY)
        try:
            data = os.read(fd, f.size + 1)
            while len(data) < f.size and (more := os.read(fd, f.size + 1 - len(data))):
                data += more
        finally:
            os.close(fd)
    except OSError as exc:
        raise DataError(file=f.rel, reason=f"cannot read: {exc.strerror or exc}") from None
    if len(data) != f.size:
        raise DataError(file=f.rel, reason=f"changed while converting: {len(data)} bytes, was {f.size}")
    return data


def write_all(plans: dict[str, list[ShardJob]], *, sample: Callable[[InputFile, bytes], tuple[str, str, bytes]],
              workers: int, progress: Callable[[int], None]) -> dict[str, list[ShardRecord]]:
    """Every planned shard, largest first across ``workers`` processes; each split's wids index."""
    jobs = [job for split_jobs in plans.values() for job in split_jobs]
    done: dict[tuple[str, int], tuple[ShardRecord, str | None]] = {}
    try:
        if workers <= 1 or len(jobs) <= 1:
            _init(sample)
            for job in jobs:
                done[(job.split, job.index)] = write_shard(job)
                progress(job.nbytes)
        else:
            _run_pool(jobs, sample=sample, workers=workers, done=done, progress=progress)
    except KeyboardInterrupt:
        raise
    except BaseException:
        _remove(plans)
        if jobs:
            finish_output(Path(jobs[0].out_dir))  # a failed run blocks no other command
        raise
    out: dict[str, list[ShardRecord]] = {}
    for name, split_jobs in plans.items():
        results = [done[(name, job.index)] for job in split_jobs]
        shards = [r for r, _ in results]
        if split_jobs:
            write_wids(Path(split_jobs[0].out_dir), name, shards, [m for _, m in results])
        out[name] = shards
    return out


def _run_pool(jobs: list[ShardJob], *, sample: Any, workers: int,
              done: dict[tuple[str, int], tuple[ShardRecord, str | None]], progress: Callable[[int], None]) -> None:
    with worker_pool(min(workers, len(jobs)), initializer=_init, initargs=(sample, True),
                     advice="try fewer --workers") as pool:
        # the biggest shards first, so the last one to finish is a small one
        futures = {pool.submit(write_shard, job): job for job in sorted(jobs, key=lambda j: -j.nbytes)}
        for future, job in futures.items():
            done[(job.split, job.index)] = future.result()
            progress(job.nbytes)


def _remove(plans: dict[str, list[ShardJob]]) -> None:
    """A failed run leaves none of its shards behind."""
    for split_jobs in plans.values():
        for job in split_jobs:
            for name in (job.name, job.name.replace(".tar", ".offsets.npy")):
                with contextlib.suppress(FileNotFoundError):
                    (Path(job.out_dir) / name).unlink()
