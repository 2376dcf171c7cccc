"""``shardsmith bench``: how fast the loader serves this dataset on this machine."""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np

from shardsmith.core import manifest as manifest_mod
from shardsmith.errors import DatasetError


def run(out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float,
        target: float | None) -> bool:
    m = manifest_mod.load(out)
    if m["format"] == "webdataset":
        return _samples(out, split=split, seconds=seconds, target=target)
    if m["format"] == "hdf5":
        return _events(out, split=split, batch_size=batch_size, seconds=seconds, target=target)
    if m["format"] != "tokens":
        raise DatasetError(f"{out}: bench does not measure {m['format']!r} datasets yet")
    from shardsmith.formats.tokens.dataset import TokenDataset

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


def _samples(out: Path, *, split: str, seconds: float, target: float | None) -> bool:
    """Shuffled random access over a sample dataset: samples/s and MB/s of member bytes, no decoding."""
    from shardsmith.loader import open as open_dataset

    ds = open_dataset(out, split=split)
    if len(ds) == 0:
        raise DatasetError(f"{out}: split {split!r} is empty")
    samples = nbytes = epoch = 0
    it = ds.iter(shuffle=True, seed=0, epoch=epoch)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for sample in it:
            samples += 1
            nbytes += sum(len(v) for k, v in sample.items() if isinstance(v, bytes))
            if samples % 256 == 0 and time.perf_counter() - t0 >= seconds:
                break
        else:
            epoch += 1
            it = ds.iter(shuffle=True, seed=0, epoch=epoch)
    elapsed = time.perf_counter() - t0
    rate = samples / elapsed
    click.echo(f"{out} [{split}]: {rate:,.0f} samples/s, {nbytes / elapsed / 1e6:,.0f} MB/s "
               f"(exact shuffled order, random access, no decoding, one process)")
    return _meets(rate, target, "samples/s")


def _meets(rate: float, target: float | None, unit: str) -> bool:
    """Whether the loader reached ``target`` (always, without one), said in one line."""
    if target is None:
        return True
    ok = rate >= target
    click.echo(f"the loader {'keeps up with' if ok else 'does NOT keep up with'} the target of {target:,.0f} {unit}")
    return ok


def _events(out: Path, *, split: str, batch_size: int, seconds: float, target: float | None) -> bool:
    """Block-shuffled batches of events (the loader's default): events/s and MB/s of decoded arrays."""
    from shardsmith.formats.hdf5.dataset import EventDataset

    ds = EventDataset(out, split=split)
    if len(ds) == 0:
        raise DatasetError(f"{out}: split {split!r} is empty")
    events = nbytes = epoch = 0
    it = ds.iter(shuffle=True, seed=0, epoch=epoch, batch_size=batch_size)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch = next(it, None)
        if batch is None:
            epoch += 1
            it = ds.iter(shuffle=True, seed=0, epoch=epoch, batch_size=batch_size)
            continue
        events += batch.n
        nbytes += sum(a.nbytes for a in batch.fixed.values()) + sum(r.values.nbytes for r in batch.ragged.values())
    elapsed = time.perf_counter() - t0
    rate = events / elapsed
    click.echo(f"{out} [{split}]: {rate:,.0f} events/s, {nbytes / elapsed / 1e6:,.0f} MB/s "
               f"(batches of {batch_size}, block shuffle, one process)")
    return _meets(rate, target, "events/s")
