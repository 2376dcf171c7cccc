"""Bytes of written shards that are not in the output folder: a cluster stage into object storage
finishes from *stand-ins* (sparse local files of the shard objects' sizes, ``engine/shuffle/outstages.py``),
and a writer that reads its shards back once all are written (``Writer.join_shards``: parquet reads
their footers, and rewrites those whose schema differs) asks for the byte ranges it reads here first.

Set by the finalize of such a stage (``bringing``), in this process only; a local run sets nothing and
``bring`` does nothing: its files are whole. A range brought into a stand-in leaves it a stand-in (it
is not uploaded); a shard rewritten from it is a new file, renamed over it, and uploaded."""

from __future__ import annotations

from collections.abc import Callable

Bring = Callable[[str, int, int], None]  # (the shard's path below the output folder, start, end)
_bring: list[Bring] = []


def bringing(fn: Bring | None) -> None:
    """Set (None: clear) what brings a range of a shard's bytes into its local stand-in."""
    _bring.clear()
    if fn is not None:
        _bring.append(fn)


def remote() -> bool:
    """Whether written shards may be stand-ins whose bytes are brought on demand."""
    return bool(_bring)


def bring(rel: str, start: int, end: int) -> None:
    """Bytes ``[start, end)`` of shard ``rel`` into its local file (nothing where the files are whole)."""
    if start < end:
        for fn in _bring:
            fn(rel, start, end)
