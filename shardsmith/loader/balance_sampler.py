"""``BalancedSampler``: a resumable batch sampler of class-balanced epochs, for the map-style torch
adapters (``DataLoader(ds, batch_sampler=BalancedSampler(...))``); ``shardsmith.torch`` exports it.

It is ``EpochBatchSampler`` with a ``BalancedOrder`` instead of a permutation: the same layout
over ranks (``formats/layout.py``: equal batch counts per rank, ``drop_last``), the same state
(``state_dict``/``load_state_dict`` through torchdata's ``StatefulDataLoader``) and the same
elastic route (``global_position`` of the ranks' states, ``start=``). It needs no torch: torch's
DataLoader takes any iterable of index lists, and torchdata any object with the two state methods.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardsmith.formats.layout import POSITION, STATE, EpochLayout, check_state, resolve_start
from shardsmith.loader.balance import INVERSE, BalancedOrder, BalanceReport, read_labels


def _distributed() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialised (torch imported only if loaded)."""
    import sys

    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class BalancedSampler:
    """Batches of dataset indices whose classes follow ``weights`` at every prefix of the epoch.

    ``labels``: a dataset with ``labels(field)`` (tar ``cls``, an event label field: read once)
    or one int per sample. ``weights``: ``"inverse"`` (equal class shares), one per class, or
    ``{class name or label: weight}``. ``num_samples``: draws per epoch (default: the dataset's
    length). Within an epoch a class's samples come without replacement, in its own shuffled
    order; a class that runs out cycles into a new shuffled pass (``report()`` counts it). The
    order is a pure function of (labels, weights, num_samples, seed, epoch); ``start=``,
    ``global_position``, ``state_dict`` work as for ``EpochBatchSampler``.
    """

    def __init__(self, labels: Any, *, batch_size: int, weights: str | Mapping[Any, float] | Sequence[float] = INVERSE,
                 field: str | None = None, num_samples: int | None = None, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True) -> None:
        names = getattr(labels, "classes", None) if hasattr(labels, "labels") else None
        self.order = BalancedOrder(read_labels(labels, field), weights, names=names)
        self.n = len(self.order.labels) if num_samples is None else int(num_samples)
        if self.n < 0:
            raise ValueError(f"num_samples={num_samples}: must be >= 0")
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.rank, self.world_size = (rank, world_size) if rank is not None and world_size else _distributed()
        self._identity = {"length": self.n, "order": self.order.name, "shuffle": bool(shuffle), "seed": int(seed)}
        self._start_epoch, self._start = resolve_start(start, epoch=epoch, identity=self._identity)
        self.epoch = self._start_epoch
        self.layout()  # a bad rank, batch size or start is refused now
        self._resume = self._produced = 0
        self._cached: tuple[int, np.ndarray] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch`` next (a state loaded for another epoch is dropped)."""
        if epoch != self.epoch:
            self._resume = self._produced = 0
        self.epoch = epoch

    @property
    def start(self) -> int:
        return self._start if self.epoch == self._start_epoch else 0

    def layout(self) -> EpochLayout:
        return EpochLayout(total=self.n, start=self.start, batch_size=self.batch_size, rank=self.rank,
                           world_size=self.world_size, drop_last=self.drop_last)

    def __len__(self) -> int:
        return self.layout().steps

    def indices(self) -> np.ndarray:
        """This epoch's whole order of dataset indices (every rank's), computed once per epoch."""
        if self._cached is None or self._cached[0] != self.epoch:
            self._cached = (self.epoch, self.order(self.n, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch))
        return self._cached[1]

    def report(self) -> BalanceReport:
        """This epoch's draws per class and the repeats of classes that ran out (the whole epoch)."""
        return self.order.report(self.n, seed=self.seed)

    def position(self, steps: int) -> dict[str, Any]:
        """The global position once every rank has taken ``steps`` batches (for ``start=``)."""
        return {"shardsmith": POSITION, **self._identity, "epoch": self.epoch,
                "position": self.layout().position_after(steps)}

    def _options(self) -> dict[str, Any]:
        return {**self._identity, "batch_size": self.batch_size, "world_size": self.world_size,
                "drop_last": bool(self.drop_last), "rank": self.rank, "workers": 1, "worker": 0}

    def state_dict(self) -> dict[str, Any]:
        """Batches handed over in this epoch, with what fixes the order (plain, JSON-able)."""
        return {"shardsmith": STATE, **self._options(), "epoch": self.epoch, "start": self.start,
                "produced": self._produced}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was saved; a state of other labels, weights or layout is refused."""
        check_state(state, self._options())
        self.epoch = self._start_epoch = int(state["epoch"])
        self._start = int(state["start"])
        self.layout()
        self._resume = self._produced = int(state["produced"])

    def __iter__(self) -> Iterator[list[int]]:
        layout, order = self.layout(), self.indices()
        first, self._resume = self._resume, 0
        self._produced = first

        def batches() -> Iterator[list[int]]:
            for step in range(first, layout.steps):
                batch = order[layout.positions(step)].tolist()
                self._produced += 1
                yield batch

        return batches()
