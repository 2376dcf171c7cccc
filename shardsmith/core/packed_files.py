"""A listing of input files as a few flat arrays, for worker processes to read without copying it.

An image folder lists hundreds of thousands of ``InputFile`` tuples (~900 bytes each with their
strings). Forked workers inherit them, but every tuple and string a worker touches has its
reference count written, which copies its page: two copy workers of a 10 GB ImageFolder (362k
files) each ended up with most of the parent's 325 MB listing as their own. Arrays are only read,
so their pages stay shared; a worker rebuilds the tuples of one shard at a time (``take``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardsmith.core.input_file import InputFile

_TEXT = ("path", "rel", "group", "origin")
_NUMBERS = ("index", "size", "mtime_ns", "ctime_ns", "ino")


def _encode(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as one byte array and their end offsets (file names keep undecodable bytes)."""
    encoded = [t.encode("utf-8", "surrogateescape") for t in texts]
    ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), ends


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedFiles:
    """``InputFile`` fields column by column: text as bytes plus end offsets, numbers as int64."""

    text: dict[str, tuple[np.ndarray, np.ndarray]]
    numbers: dict[str, np.ndarray]

    @classmethod
    def of(cls, files: Sequence[InputFile]) -> PackedFiles:
        return cls(text={name: _encode([getattr(f, name) for f in files]) for name in _TEXT},
                   numbers={name: np.fromiter((getattr(f, name) for f in files), dtype=np.int64, count=len(files))
                            for name in _NUMBERS})

    def __len__(self) -> int:
        return len(self.numbers["index"])

    def take(self, start: int, stop: int) -> tuple[InputFile, ...]:
        """Files ``[start, stop)`` as the tuples they were."""
        columns: dict[str, list] = {}
        for name, (blob, ends) in self.text.items():
            begin = int(ends[start - 1]) if start else 0
            raw = blob[begin:int(ends[stop - 1]) if stop > start else begin].tobytes()
            cuts = (ends[start:stop] - begin).tolist()
            columns[name] = [raw[a:b].decode("utf-8", "surrogateescape") for a, b in zip([0, *cuts[:-1]], cuts)]
        for name, values in self.numbers.items():
            columns[name] = values[start:stop].tolist()
        return tuple(InputFile(**dict(zip(columns, row))) for row in zip(*columns.values()))
