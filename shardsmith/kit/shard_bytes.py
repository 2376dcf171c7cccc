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
_records_as_written: list[bool] = [True]


def bringing(fn: Bring | None, *, as_written: bool = True) -> None:
    """Set (None: clear) what brings a range of a shard's bytes into its local stand-in;
    ``as_written``: every shard's record is its writer's (no earlier finalize rewrote one, whose
    object may be old or new), so what a record says of its shard's bytes holds."""
    _bring.clear()
    if fn is not None:
        _bring.append(fn)
    _records_as_written[0] = as_written or fn is None


def records_as_written() -> bool:
    """Whether every shard's record is the one its writer made (``bringing``)."""
    return _records_as_written[0]


def remote() -> bool:
    """Whether written shards may be stand-ins whose bytes are brought on demand."""
    return bool(_bring)


def bring(rel: str, start: int, end: int) -> None:
    """Bytes ``[start, end)`` of shard ``rel`` into its local file (nothing where the files are whole)."""
    if start < end:
        for fn in _bring:
            fn(rel, start, end)
