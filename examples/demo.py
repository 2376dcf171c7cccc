"""The demo behind `make demo`: pack the bundled corpus into shuffled tokens and read it back."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def shardsmith(*args: str) -> None:
    cmd = [sys.executable, "-m", "shardsmith", *args]
    print("$ shardsmith " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    tokens = args.out / "tokens"
    t0 = time.perf_counter()
    # 1. text → a trained byte-level BPE → exactly shuffled Megatron shards (+ nanoGPT train.bin/val.bin)
    shardsmith("pack-tokens", str(HERE / "corpus"), "-o", str(tokens), "--train-tokenizer", "4096",
               "--split", "train=0.9,val=0.1", "--seq-len", "256", "--nanogpt", "--quiet")
    print(f"packed in {time.perf_counter() - t0:.1f} s")
    shardsmith("inspect", str(tokens))

    # 2. read it back the way a training loop does
    import numpy as np

    import shardsmith as ss

    ds = ss.TokenDataset(tokens, seq_len=256, split="train")
    it = ds.iter(shuffle=True, seed=0, epoch=0, batch_size=8)
    x, y = next(it)
    assert x.shape == (8, 256) and np.array_equal(x[:, 1:], y[:, :-1])
    print(f"TokenDataset: {len(ds)} windows of 256 tokens; first batch x{x.shape} y{y.shape}, "
          f"resume state {it.state_dict()}")
    docs = ss.open(tokens, split="val")
    print(f"val documents: {len(docs)}; val[0] has {len(docs[0])} tokens ending in eos {docs[0][-1]}")

    # 3. loader throughput on this machine
    shardsmith("bench", str(tokens), "--seq-len", "256", "--seconds", "1")

    # 4. an image folder → exactly shuffled webdataset tar shards, bytes unchanged, then augmented copies
    images = args.out / "images"
    shardsmith("convert", str(HERE / "images"), "-o", str(images), "--to", "webdataset", "--shard-samples", "10",
               "--split", "train=0.8,val=0.2", "--quiet")
    ds = ss.open(images, split="train")
    first = ds[0]
    print(f"webdataset: {len(ds)} train samples; ds[0] = key {first['__key__']}, "
          f"{len(first['jpg'])} JPEG bytes, class {ds.classes[first['cls']]!r}")
    import webdataset as wds

    n = sum(1 for _ in wds.WebDataset([str(p) for p in ds.shard_paths], shardshuffle=False))
    print(f"webdataset.WebDataset reads the same shards: {n} samples")
    augmented = args.out / "images-augmented"
    shardsmith("convert", str(HERE / "images"), "-o", str(augmented), "--to", "webdataset",
               "--augment", "random-resized-crop=64,hflip", "--copies", "2", "--quiet")
    aug = ss.open(augmented, decode="numpy")
    print(f"augmented: {len(aug)} samples (2 copies of each image), first image {aug[0]['jpg'].shape}")

    # 5. physics events: a small IceCube-like ROOT file (made here with uproot) → exactly shuffled HDF5
    from shardsmith.demo.root_files import make_icecube_like
    from shardsmith.kit.collate import collate_events

    root_file = make_icecube_like(args.out / "icecube-like.root", events=5000, mean_pulses=60, seed=0)
    events = args.out / "events"
    shardsmith("convert", str(root_file), "-o", str(events), "--to", "hdf5", "--compression", "gzip",
               "--split", "train=0.9,val=0.1", "--quiet")
    ev = ss.open(events)
    batch = ev.get_batch(np.arange(16))
    padded = collate_events(batch, ragged="pad", max_len=128)
    print(f"events: {len(ev)} train events; event 0 has {len(ev[0]['pulses_time'])} pulses; a padded batch "
          f"of 16: pulses_time {padded['pulses_time'].shape}, lengths from offsets only: "
          f"{ev.lengths('n_pulses')[:5].tolist()}…")
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
