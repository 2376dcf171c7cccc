"""One open tar shard: its member table as compact arrays, and the closure ``ds[i]`` calls to
slice a sample out of the shard's map and decode its members.
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsmith.core.identity import intact
from shardsmith.formats.webdataset.decode import _guard


@dataclass(slots=True)
class _MemberTable:
    """One shard's samples as compact arrays: members of sample j are ``first[j]:first[j+1]``."""

    keys: list[str] = field(default_factory=list)
    first: array = field(default_factory=lambda: array("q", [0]))
    data: array = field(default_factory=lambda: array("q"))
    size: array = field(default_factory=lambda: array("q"))
    ext: array = field(default_factory=lambda: array("H"))
    exts: list[str] = field(default_factory=list)


# ds[i] of an open shard: (its sample number, whether to look at the file first) -> the sample
_Open = Callable[..., dict[str, Any]]


def _shard_reader(mm: mmap.mmap, table: _MemberTable, decoders: list[Callable[[bytes], Any] | None],
                  where: str) -> _Open:
    """Sample j of one shard, by slicing its map where the table says: a closure over the shard's
    arrays, so that each sample costs a few list lookups and one copy per member (and a look at the
    file's size: ``identity.intact``; ``look=False`` for the samples of a batch after its first in this
    shard, ``TarDataset.read``: one fstat was a third of a small sample's cost)."""
    keys, first, data, size, ext, names = table.keys, table.first, table.data, table.size, table.ext, table.exts
    guarded = [None if d is None else _guard(d, name, where) for d, name in zip(decoders, names)]
    mapped, size_now = len(mm), mm.size

    def read(j: int, look: bool = True) -> dict[str, Any]:
        if look and size_now() < mapped:  # (``intact``, its test inline: one fstat is the whole cost)
            intact(mm, where)
        sample: dict[str, Any] = {"__key__": keys[j]}
        for k in range(first[j], first[j + 1]):
            start = data[k]
            e = ext[k]
            decode = guarded[e]
            raw = mm[start:start + size[k]]
            sample[names[e]] = raw if decode is None else decode(raw, start)
        return sample

    return read


def _ranged_reader(read_range: Callable[[int, int], bytes], table: _MemberTable,
                   decoders: list[Callable[[bytes], Any] | None], where: str) -> _Open:
    """Sample j of one shard that is not local: its members' bytes in one ranged read (from the
    first member's data to the last one's end), sliced where the table says."""
    keys, first, data, size, ext, names = table.keys, table.first, table.data, table.size, table.ext, table.exts
    guarded = [None if d is None else _guard(d, name, where) for d, name in zip(decoders, names)]

    def read(j: int, look: bool = True) -> dict[str, Any]:  # (nothing mapped to look at)
        a, b = first[j], first[j + 1]
        base = data[a]
        buf = read_range(base, data[b - 1] + size[b - 1])
        sample: dict[str, Any] = {"__key__": keys[j]}
        for k in range(a, b):
            start = data[k]
            e = ext[k]
            decode = guarded[e]
            raw = buf[start - base:start - base + size[k]]
            sample[names[e]] = raw if decode is None else decode(raw, start)
        return sample

    return read


def _compact(values: np.ndarray, code: str) -> array:
    """An int array as a compact ``array``, whose items index as Python ints faster than numpy's."""
    return array(code, values.astype(np.dtype(code), copy=False).tobytes())

