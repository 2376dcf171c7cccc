"""Epoch orders: a pure function of (n, seed, epoch, rank, world_size).

The permutation is argsort of the same 64-bit mixing the offline shuffle uses, so it does not
depend on numpy's random streams. ``rank``/``world_size`` give a rank's single samples as the
loader deals them (``kit/rank_split.py``'s layout with batches of one): a stride of the
permutation after dropping ``n % world_size`` items (different ones each epoch), so every rank
gets the same count and no item is seen twice.
"""

from __future__ import annotations

import numpy as np

from shardsmith.kit.keys import mix64, path_hash


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


def window_of(indices: np.ndarray) -> slice | None:
    """``indices`` as a slice when they are one ascending run ``a, a+1, ..., a+n-1`` (a window, or a
    block of an epoch: read as one slice per array), else None."""
    n = len(indices)
    if not n or int(indices[-1]) - int(indices[0]) != n - 1 or (n > 1 and not bool(np.all(indices[1:] > indices[:-1]))):
        return None
    return slice(int(indices[0]), int(indices[0]) + n)
