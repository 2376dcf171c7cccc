"""``shardsmith bench``: how fast the loader serves this dataset on this machine (the format measures)."""

from __future__ import annotations

from pathlib import Path

import click

from shardsmith import registry
from shardsmith.kit import manifest_io


def run(out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float,
        target: float | None) -> bool:
    m = manifest_io.load(out)
    rate = registry.format_of(m, where=str(out)).bench(out, split=split, seq_len=seq_len, batch_size=batch_size,
                                                        seconds=seconds)
    click.echo(rate.line)
    if target is None:
        return True
    ok = rate.value >= target
    shown = f"{target / 1e6:,.2f} M {rate.unit}" if target >= 1e6 else f"{target:,.0f} {rate.unit}"
    click.echo(f"the loader {'keeps up with' if ok else 'does NOT keep up with'} the target of {shown} "
               f"({rate.value / target:.1f}× the target)")
    return ok
