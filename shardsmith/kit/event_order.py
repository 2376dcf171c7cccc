"""The order an epoch visits events in (``event_order``): shuffled blocks that keep reads
contiguous, or an exact permutation. Ranks and workers split it as every order is split
(``kit/rank_split.py``, ``EpochLayout``).
"""

from __future__ import annotations

import numpy as np

from shardsmith.kit.keys import path_hash
from shardsmith.kit.order import epoch_order


def event_order(n: int, *, shuffle: bool, seed: int, epoch: int, block: int = 256, exact: bool = False) -> np.ndarray:
    """Every event index of one epoch, in visiting order (before any rank split).

    ``exact``: a full per-event permutation (``epoch_order``). Otherwise contiguous blocks of
    ``block`` events in a permuted order (``shuffle``) or in file order, rotated by a per-epoch
    offset, so that a batch of a block is one contiguous read (one wraps around the end) and the
    events after the ranks' last whole step are a different stretch each epoch.
    """
    if block < 1:
        raise ValueError(f"block={block}: must be at least 1")
    if exact and shuffle:
        return epoch_order(n, shuffle=True, seed=seed, epoch=epoch)
    if shuffle and n > block:
        # Rotate by a per-epoch offset, then permute the whole blocks and keep the one short block
        # last: batches of ``block`` events stay one contiguous read each (one wraps around the end).
        rotate = int(path_hash(f"blocks:{seed}", str(epoch)) % np.uint64(n))
        full = n // block
        blocks = epoch_order(full, shuffle=True, seed=seed, epoch=epoch)
        order = (np.repeat(blocks * block, block) + np.tile(np.arange(block, dtype=np.int64), full))
        order = np.concatenate([order, np.arange(full * block, n, dtype=np.int64)])
        return (order + rotate) % n
    return np.arange(n, dtype=np.int64)
