"""Resume in the middle of an epoch (issue 16): time from ``load_state_dict`` to the first batch.

A token dataset of --samples windows (written directly: ids 0, 1, 2, ...), ``TokenBatches`` under
torchdata's ``StatefulDataLoader`` with --workers workers, stopped half way through the epoch.
Rows (medians of --repeat, worker start-up included in every row):
- ``state_dict``: our adapters' state, loaded back (each worker jumps to its batch);
- ``replay``: the same batches from an iterable without ``state_dict`` (what the adapters were
  before): torchdata fast-forwards by fetching every batch before the save point again;
- ``elastic``: a new layout (twice the world size, one more worker) from ``global_position``;
- ``fresh``: the first batch of an epoch from its start (the floor: worker start-up, the order).
Every row's first batch is checked against the uninterrupted run's.

    .venv/bin/python bench/bench_resume.py [--samples 1000000] [--seq-len 32] [--batch-size 32]
                                           [--workers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import code_version, key_figure  # noqa: E402

import shardsmith  # noqa: E402
from shardsmith.core import manifest  # noqa: E402
from shardsmith.formats.tokens.writer import idx_bytes  # noqa: E402
from shardsmith.kit import manifest_io
from shardsmith.torch import TokenBatches, global_position  # noqa: E402

warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
warnings.filterwarnings("ignore", message="This DataLoader will create")


def write_tokens(out: Path, *, windows: int, seq_len: int, shards: int = 4) -> Path:
    """Token ids 0, 1, 2, ... (mod 65000) in Megatron shards and a manifest."""
    out.mkdir(parents=True, exist_ok=True)
    tokens = (np.arange(windows * seq_len + 1, dtype=np.int64) % 65000).astype(np.uint16)
    (out / "tokenizer.json").write_text("{}")
    entries = []
    for s, part in enumerate(np.array_split(tokens, shards)):
        b, i = out / f"train-{s:05d}.bin", out / f"train-{s:05d}.idx"
        b.write_bytes(part.tobytes())
        i.write_bytes(idx_bytes(np.array([len(part)]), np.dtype(np.uint16)))
        sha = [hashlib.sha256(f.read_bytes()).hexdigest() for f in (b, i)]
        entries.append({"path": b.name, "samples": 1, "bytes": b.stat().st_size, "sha256": sha[0],
                        "tokens": len(part), "index": {"path": i.name, "bytes": i.stat().st_size, "sha256": sha[1]}})
    tok = {"path": "tokenizer.json", "sha256": hashlib.sha256(b"{}").hexdigest(), "vocab_size": 65000,
           "dtype": "uint16"}
    manifest_io.save(out, manifest.new_manifest(
        fmt="tokens", seed=0, shuffle=True, source={"reader": "bench", "inputs": []}, schema={},
        splits={"train": {"samples": shards, "shards": entries}}, tokenizer=tok, seq_len=seq_len))
    return out


class Stateless(IterableDataset):
    """The same batches without ``state_dict``: torchdata can only replay them."""

    def __init__(self, inner: TokenBatches) -> None:
        self.inner = inner

    def __iter__(self):
        return iter(self.inner)


def loader(dataset, workers: int) -> StatefulDataLoader:
    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers)


def state_at(dataset, workers: int, steps: int) -> tuple[dict, torch.Tensor]:
    """The loader's state after ``steps`` batches, and the batch the uninterrupted run yields next."""
    dl = loader(dataset, workers)
    it = iter(dl)
    for _ in range(steps):
        next(it)
    state = dl.state_dict()
    return state, next(it)[0]


def first_batch(make, state: dict | None) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    dl = make()
    if state is not None:
        dl.load_state_dict(state)
    x = next(iter(dl))[0]
    return time.perf_counter() - t0, x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {code_version()}")
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        ds = shardsmith.TokenDataset(write_tokens(Path(tmp) / "tokens", windows=args.samples, seq_len=args.seq_len))
        opts = {"batch_size": args.batch_size, "seed": 0, "rank": 0, "world_size": 1}
        steps = len(TokenBatches(ds, **opts)) // 2
        print(f"{len(ds):,} windows of {args.seq_len} tokens, batch {args.batch_size}, {args.workers} workers: "
              f"resume at batch {steps:,} of {2 * steps:,}")
        t0 = time.perf_counter()
        ours, want = state_at(TokenBatches(ds, **opts), args.workers, steps)
        print(f"  (reaching the middle of the epoch: {time.perf_counter() - t0:.1f} s)")
        theirs, want_replay = state_at(Stateless(TokenBatches(ds, **opts)), args.workers, steps)
        assert torch.equal(want, want_replay)
        pos = global_position(ours)
        rows = {
            "state_dict (ours)": (lambda: loader(TokenBatches(ds, **opts), args.workers), ours, want),
            "replay (no state_dict)": (lambda: loader(Stateless(TokenBatches(ds, **opts)), args.workers), theirs, want),
            "elastic (global_position, 2 ranks)": (
                lambda: loader(TokenBatches(ds, **{**opts, "world_size": 2}, start=pos), args.workers + 1), None,
                None),
            "fresh epoch (floor)": (lambda: loader(TokenBatches(ds, **opts), args.workers), None, None),
        }
        times = {}
        for name, (make, state, expect) in rows.items():
            runs = []
            for _ in range(args.repeat):
                seconds, x = first_batch(make, state)
                if expect is not None:
                    assert torch.equal(x, expect), f"{name}: the first batch after the resume differs"
                runs.append(seconds)
            times[name] = statistics.median(runs)
            print(f"  {name:38s} {times[name]:8.3f} s to the first batch")
        ratio = times["replay (no state_dict)"] / times["state_dict (ours)"]
        print(f"  replay / state_dict: {ratio:.0f}x")
        key_figure(f"resume at batch {steps:,}", f"{times['state_dict (ours)']:.3f} s to the first batch, {ratio:.0f}x "
                   f"sooner than replay; a fresh epoch: {times['fresh epoch (floor)']:.3f} s")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
