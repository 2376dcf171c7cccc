"""Epoch orders: a pure function of (n, seed, epoch, rank, world_size), and an iterator that can resume.

The permutation is argsort of the same 64-bit mixing the offline shuffle uses, so it does not
depend on numpy's random streams. Ranks take strided slices of one permutation after dropping
``n % world_size`` items (different ones each epoch), so every rank gets the same count and no
item is seen twice.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np

from shardsmith.kit.keys import mix64, path_hash

T = TypeVar("T")


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
    """This rank's indices for this epoch, in visiting order."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
    idx = np.arange(n, dtype=np.int64)
    if shuffle and n > 1:
        base = path_hash(f"epoch:{seed}", str(epoch))
        with np.errstate(over="ignore"):
            keys = mix64(np.uint64(base) ^ mix64(idx.astype(np.uint64) + np.uint64(1)))
        idx = np.argsort(keys, kind="stable")
    usable = n - n % world_size
    return idx[:usable][rank::world_size]


def plain_count(value: Any) -> int | None:
    """An optional count as a plain int (a numpy int saved in a state is a plain int read back)."""
    return None if value is None else operator.index(value)


class ResumableIterator(Generic[T]):
    """Walks one epoch's order; ``state_dict()`` / ``load_state_dict()`` resume exactly mid-epoch."""

    def __init__(self, *, n: int, get_item: Callable[[int], T], get_batch: Callable[[np.ndarray], T], shuffle: bool, seed: int, epoch: int,
                 rank: int, world_size: int, batch_size: int | None, drop_last: bool = False) -> None:
        self._n = n
        self._get_item = get_item
        self._get_batch = get_batch
        self._config = {"shuffle": bool(shuffle), "seed": int(seed), "epoch": int(epoch), "rank": int(rank),
                        "world_size": int(world_size), "batch_size": plain_count(batch_size),
                        "drop_last": bool(drop_last)}
        self._order = epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size)
        self.position = 0

    def __len__(self) -> int:
        bs = self._config["batch_size"]
        if bs is None:
            return len(self._order)
        return len(self._order) // bs if self._config["drop_last"] else -(-len(self._order) // bs)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if not self._config["batch_size"]:  # one item: no slice, no numpy scalar
            pos = self.position
            if pos >= len(self._order):
                raise StopIteration
            self.position = pos + 1
            return self._get_item(self._order.item(pos))
        bs = self._config["batch_size"] or 1
        if self.position >= len(self._order):
            raise StopIteration
        chunk = self._order[self.position:self.position + bs]
        if self._config["drop_last"] and len(chunk) < bs:
            raise StopIteration
        self.position += len(chunk)
        return self._get_batch(chunk) if self._config["batch_size"] else self._get_item(int(chunk[0]))

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and strings: safe to save as JSON next to a checkpoint."""
        return {**self._config, "position": self.position, "length": self._n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off; the dataset and options must be the same."""
        if not isinstance(state, dict):
            raise ValueError("state_dict: not what ResumableIterator.state_dict() returned")
        for key, value in self._config.items():  # of the same type: a saved True is not a 1, nor 5.0 a 5
            if type(state.get(key)) is not type(value) or state.get(key) != value:
                raise ValueError(f"state_dict was saved with {key}={state.get(key)!r}, this iterator has {value!r}")
        if type(state.get("length")) is not int or state.get("length") != self._n:
            raise ValueError(f"state_dict was saved for {state.get('length')!r} items, the dataset has {self._n}")
        position = state.get("position")
        if type(position) is not int or not 0 <= position <= len(self._order):
            raise ValueError(f"state_dict position {position!r} is out of range")
        self.position = position


def window_of(indices: np.ndarray) -> slice | None:
    """``indices`` as a slice when they are one ascending run ``a, a+1, ..., a+n-1`` (a window, or a
    block of an epoch: read as one slice per array), else None."""
    n = len(indices)
    if not n or int(indices[-1]) - int(indices[0]) != n - 1 or (n > 1 and not bool(np.all(indices[1:] > indices[:-1]))):
        return None
    return slice(int(indices[0]), int(indices[0]) + n)
