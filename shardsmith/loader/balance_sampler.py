"""``BalancedSampler``: a resumable batch sampler of class-balanced epochs, for the map-style torch
adapters (``DataLoader(ds, batch_sampler=BalancedSampler(...))``); ``shardsmith.torch`` exports it.

It is ``EpochBatchSampler`` with a ``BalancedOrder`` instead of a permutation, on the same
``EpochStream`` (``kit/epoch.py``): the same layout over ranks (``kit/rank_split.py``: equal
batch counts per rank, ``drop_last``), the same state (``state_dict``/``load_state_dict`` through
torchdata's ``StatefulDataLoader``) and the same elastic route (``global_position`` of the ranks' states, ``start=``). It needs no torch: torch's
DataLoader takes any iterable of index lists, and torchdata any object with the two state methods.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardsmith.kit.epoch import EpochStream
from shardsmith.loader.balanced_order import INVERSE, BalancedOrder, BalanceReport, read_labels


class BalancedSampler(EpochStream):
    """Batches of dataset indices whose classes follow ``weights`` at every prefix of the epoch.

    ``labels``: a dataset with ``labels(field)`` (tar ``cls``, an event label field: read once)
    or one int per sample. ``weights``: ``"inverse"`` (equal class shares), one per class, or
    ``{class name or label: weight}``. ``num_samples``: draws per epoch (default: the dataset's
    length). Within an epoch a class's samples come without replacement, in its own shuffled
    order; a class that runs out cycles into a new shuffled pass (``report()`` counts it). The
    order is a pure function of (labels, weights, num_samples, seed, epoch); ``start=``,
    ``global_position``, ``state_dict`` work as for ``EpochBatchSampler`` (``kit/epoch.py``).
    """

    def __init__(self, labels: Any, *, batch_size: int, weights: str | Mapping[Any, float] | Sequence[float] = INVERSE,
                 field: str | None = None, num_samples: int | None = None, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True) -> None:
        names = getattr(labels, "classes", None) if hasattr(labels, "labels") else None
        order = BalancedOrder(read_labels(labels, field), weights, names=names)
        n = len(order.labels) if num_samples is None else int(num_samples)
        if n < 0:
            raise ValueError(f"num_samples={num_samples}: must be >= 0")
        self._cached: tuple[int, np.ndarray] | None = None
        super().__init__(n, order=order, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, start=start, drop_last=drop_last)

    def indices(self) -> np.ndarray:
        """This epoch's whole order of dataset indices (every rank's), computed once per epoch."""
        if self._cached is None or self._cached[0] != self.epoch:
            self._cached = (self.epoch, super().indices())
        return self._cached[1]

    def report(self, *, steps: int | None = None) -> BalanceReport:
        """The draws per class delivered so far in this epoch, and the repeats of classes that ran out,
        over every rank (each takes as many batches): those before the start position, then the
        batches handed over (a resumed ``state_dict`` counts its own), never the draws yet to come.

        ``steps``: count as if every rank had taken ``steps`` batches, as ``position(steps)`` does. A
        DataLoader with workers takes batches ahead of the loop (``num_workers × prefetch_factor``),
        so mid-epoch the loop's own count is the exact one there; at the epoch's end both agree."""
        if steps is not None:
            return self.order.report(self.layout().position_after(steps), seed=self.seed)
        saved = self._saved()
        layout = self.layout(start=saved["start"])
        return self.order.report(layout.position_after(min(saved["produced"], layout.steps)), seed=self.seed)

    def __iter__(self) -> Iterator[list[int]]:
        return (batch.tolist() for batch in self._walk())
