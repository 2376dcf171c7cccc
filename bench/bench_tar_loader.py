"""Tar loader (issue 3): random access ``ds[i]`` and shuffled iteration vs webdataset and wids.

Writes ~20k small samples (a 1-3 KB ``jpg`` payload, random bytes, and a ``cls``) into tar shards
with shardsmith's tar format helpers, then times from a warm page cache (medians of --repeat):
- ``TarDataset[i]`` in a random order (target: 100k samples/s) and wids ``ShardListDataset[i]``;
- ``TarDataset.iter(shuffle=True)`` over the whole split vs ``webdataset.WebDataset`` in order;
- the same in batches of 64, by ``ds.iter`` and by the torch adapter ``TarIterable`` in this process
  (the loader's pipeline with its skip policy, which must cost nothing when nothing is skipped).

    .venv/bin/python bench/bench_tar_loader.py [--samples 20000] [--shards 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
from harness import key_figure, median_time, verdict

from shardsmith.core import manifest
from shardsmith.formats.webdataset.dataset import TarDataset
from shardsmith.formats.webdataset.tarfmt import end_of_archive, sample_members
from shardsmith.kit import manifest_io

TARGET_RANDOM = 100_000


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_dataset(out: Path, *, samples: int, shards: int, seed: int = 0) -> None:
    """Shards, offset indexes and a manifest, as the webdataset writer lays them out."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    per = -(-samples // shards)
    entries = []
    for s in range(shards):
        keys = range(s * per, min(samples, (s + 1) * per))
        chunks: list[bytes | memoryview] = []
        offsets, pos = [], 0
        for k in keys:
            offsets.append(pos)
            payload = rng.bytes(int(rng.integers(1000, 3000)))
            for c in sample_members(f"{k:08d}", [("jpg", payload), ("cls", b"%d" % (k % 10))]):
                chunks.append(c)
                pos += len(c)
        offsets.append(pos)
        chunks.append(end_of_archive(pos))
        tar, idx = out / f"train-{s:06d}.tar", out / f"train-{s:06d}.offsets.npy"
        tar.write_bytes(b"".join(chunks))
        np.save(idx, np.array(offsets, dtype=np.int64))
        entries.append({"path": tar.name, "samples": len(keys), "bytes": tar.stat().st_size, "sha256": sha256(tar),
                        "index": {"path": idx.name, "bytes": idx.stat().st_size, "sha256": sha256(idx)}})
    m = manifest.new_manifest(fmt="webdataset", seed=seed, shuffle=False, source={"reader": "bench"},
                              schema={"jpg": {"kind": "image"}, "cls": {"kind": "int"}},
                              splits={"train": {"samples": samples, "shards": entries}},
                              classes=[str(c) for c in range(10)])
    manifest_io.save(out, m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-tar-") as tmp:
        out = Path(tmp) / "ds"
        write_dataset(out, samples=args.samples, shards=args.shards)
        mb = sum(p.stat().st_size for p in out.glob("*.tar")) / 1e6
        print(f"{args.samples} samples in {args.shards} shards, {mb:.1f} MB")
        ds = TarDataset(out)
        n = len(ds)
        order = np.random.default_rng(1).permutation(n).tolist()
        for p in ds.shard_paths:  # warm the page cache
            p.read_bytes()

        def random_access() -> None:
            for i in order:
                ds[i]

        def shuffled_iter() -> None:
            for _ in ds.iter(shuffle=True, seed=0, epoch=0):
                pass

        def wds_iter() -> None:
            for _ in ds.webdataset():
                pass

        def batched_iter() -> None:
            for _ in ds.iter(shuffle=True, seed=0, epoch=0, batch_size=64):
                pass

        rows = {"TarDataset[i], random order": median_time(random_access, args.repeat),
                "TarDataset.iter(shuffle=True)": median_time(shuffled_iter, args.repeat),
                "TarDataset.iter(batch_size=64)": median_time(batched_iter, args.repeat),
                "webdataset.WebDataset, in order": median_time(wds_iter, args.repeat)}
        with contextlib.suppress(ImportError):  # the torch adapter, in this process (the pipeline, no workers)
            from shardsmith.torch import TarIterable

            def adapter_iter() -> None:
                for _ in TarIterable(ds, batch_size=64, seed=0, rank=0, world_size=1):
                    pass

            rows["TarIterable(batch_size=64), no workers"] = median_time(adapter_iter, args.repeat)
        with contextlib.suppress(ImportError):
            import wids

            shards = [{"url": str(p), "nsamples": e["samples"]}
                      for p, e in zip(ds.shard_paths, ds.manifest["splits"]["train"]["shards"])]
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                wd = wids.ShardListDataset(shards, cache_dir=str(Path(tmp) / "wids"), transformations=[])
                wd[0]

            def wids_random() -> None:
                for i in order:
                    wd[i]

            rows["wids.ShardListDataset[i], random order"] = median_time(wids_random, args.repeat)

        for name, sec in rows.items():
            print(f"{name:42s} {sec:7.3f} s  {n / sec:10,.0f} samples/s")
        ra = n / rows["TarDataset[i], random order"]
        verdict("issue 3: ds[i] in random order >= 100k samples/s", ra >= TARGET_RANDOM,
                f"{ra:,.0f} samples/s = {ra / TARGET_RANDOM:.2f}x the target")
        ratio = rows["webdataset.WebDataset, in order"] / rows["TarDataset.iter(shuffle=True)"]
        verdict("issue 3: shuffled iteration >= 2x webdataset's in-order", ratio >= 2, f"{ratio:.2f}x")
        if "wids.ShardListDataset[i], random order" in rows:
            key_figure("random access vs wids", f"{rows['wids.ShardListDataset[i], random order'] / rows['TarDataset[i], random order']:.2f}x faster")
        else:
            print("wids: not installed (pip install -e '.[dev]')")
    print(f"load average at end: {os.getloadavg()}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
