"""The order a rank visits events in one epoch (``event_order``: shuffled blocks that keep reads
contiguous, or an exact permutation), and the resumable iterator that walks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shardsmith.kit.keys import path_hash
from shardsmith.kit.order import ResumableIterator, epoch_order


def event_order(n: int, *, shuffle: bool, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
                block: int = 256, exact: bool = False) -> np.ndarray:
    """This rank's event indices for one epoch, in visiting order.

    ``exact``: a full per-event permutation, dealt to ranks by stride (as ``epoch_order``).
    Otherwise contiguous blocks of ``block`` events in a permuted order (``shuffle``) or in file
    order, and each rank takes one contiguous stretch of that sequence, so reads stay
    contiguous. Every rank gets ``n // world_size`` events: the last ``n % world_size`` of the
    sequence are dropped (different ones each epoch when shuffled).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
    if block < 1:
        raise ValueError(f"block={block}: must be at least 1")
    if exact and shuffle:
        return epoch_order(n, shuffle=True, seed=seed, epoch=epoch, rank=rank, world_size=world_size)
    if shuffle and n > block:
        # Rotate by a per-epoch offset, then permute the whole blocks and keep the one short block
        # last: batches of ``block`` events stay one contiguous read each (one wraps around the end),
        # and the remainder dropped for the ranks is a different stretch each epoch.
        rotate = int(path_hash(f"blocks:{seed}", str(epoch)) % np.uint64(n))
        full = n // block
        blocks = epoch_order(full, shuffle=True, seed=seed, epoch=epoch)
        order = (np.repeat(blocks * block, block) + np.tile(np.arange(block, dtype=np.int64), full))
        order = np.concatenate([order, np.arange(full * block, n, dtype=np.int64)])
        order = (order + rotate) % n
    else:
        order = np.arange(n, dtype=np.int64)
    share = n // world_size
    return order[rank * share:(rank + 1) * share]


class EventIterator(ResumableIterator[Any]):
    """``ResumableIterator`` over an ``event_order`` (block or exact shuffle); same state_dict rules."""

    def __init__(self, *, n: int, order: np.ndarray, get_item: Callable[[int], Any],
                 get_batch: Callable[[np.ndarray], Any], config: dict[str, Any]) -> None:
        # The base class builds an epoch_order; ours is given, so set its fields directly.
        self._n = n
        self._get_item = get_item
        self._get_batch = get_batch
        self._config = config
        self._order = order
        self.position = 0
