"""``shardsmith bench``: how fast the loader serves this dataset on this machine."""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np

from shardsmith import manifest as manifest_mod
from shardsmith.errors import DatasetError


def run(out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float,
        target: float | None) -> bool:
    m = manifest_mod.load(out)
    if m["format"] != "tokens":
        raise DatasetError(f"{out}: bench measures token datasets so far, not {m['format']!r}")
    from shardsmith.loader.tokens import TokenDataset

    ds = TokenDataset(out, seq_len=seq_len or m.get("seq_len") or 1024, split=split)
    if len(ds) < 1:
        raise DatasetError(f"{out}: split {split!r} holds fewer than seq_len+1 tokens")
    it = ds.iter(shuffle=True, seed=0, batch_size=min(batch_size, len(ds)))
    batches = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        try:
            x, _ = next(it)
        except StopIteration:
            it = ds.iter(shuffle=True, seed=0, epoch=batches + 1, batch_size=min(batch_size, len(ds)))
            continue
        batches += 1
        assert x.dtype == np.int64
    elapsed = time.perf_counter() - t0
    tokens_per_s = batches * min(batch_size, len(ds)) * ds.seq_len / elapsed
    click.echo(f"{out} [{split}]: {batches / elapsed:,.0f} batches/s of {batch_size}×{ds.seq_len}, "
               f"{tokens_per_s / 1e6:,.1f} M tokens/s (shuffled random windows, one process)")
    if target is None:
        return True
    ok = tokens_per_s >= target
    verdict = "keeps up with" if ok else "does NOT keep up with"
    click.echo(f"the loader {verdict} the target of {target / 1e6:,.2f} M tokens/s "
               f"({tokens_per_s / target:.1f}× the target)")
    return ok
