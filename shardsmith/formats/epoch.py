"""``EpochStream``: one epoch's batches for one rank (or one DataLoader worker of it) from a start
position, and the state that resumes them. numpy and plain dicts only: ``shardsmith.torch``'s
adapters and ``EpochBatchSampler`` and the torch-free ``BalancedSampler`` share it, so the
epoch/start/layout/state rules exist once (``formats/layout.py`` holds the layout and the checks).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from shardsmith.formats.layout import POSITION, STATE, EpochLayout, check_state, resolve_start

# (n, *, shuffle, seed, epoch) -> the epoch's order of item indices, with a ``name`` (``EpochOrder``)
Order = Callable[..., np.ndarray]


def distributed() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialised (torch is never imported here)."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class EpochStream:
    """One epoch's batches for this rank from a start position, and the state that resumes them.

    ``order``: the epoch's order (``EpochOrder``, a mixture's or a balanced order; its ``name``
    goes into the state). ``start``: a position in the epoch's order (int, for epoch ``epoch``)
    or a ``global_position`` (which sets the epoch to its own); ``set_epoch`` to any other epoch
    starts at 0. ``state_dict()`` holds plain ints and strings; ``load_state_dict`` refuses a
    state of another dataset, order or layout and adopts the state's epoch and start. Batches of
    step s go to stream ``s % streams`` (``_stream``: one, unless a subclass runs in workers).
    """

    def __init__(self, n: int, *, order: Order, batch_size: int | None, shuffle: bool, seed: int, epoch: int,
                 rank: int | None, world_size: int | None, start: int | Mapping[str, Any] | None,
                 drop_last: bool) -> None:
        self.n = n
        self.order = order
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank, self.world_size = (rank, world_size) if rank is not None and world_size else distributed()
        self._identity = {"length": int(n), "order": order.name, "shuffle": bool(shuffle), "seed": int(seed)}
        self._start_epoch, self._start = resolve_start(start, epoch=epoch, identity=self._identity)
        self.epoch = self._start_epoch  # a global position sets the epoch it is in
        self.layout()  # refuse a bad rank, batch size or start now rather than in a worker
        self._resume = 0    # batches this stream had handed over when its state was saved
        self._produced = 0  # batches this stream has handed over in the running iteration

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next (a state loaded for another epoch is dropped)."""
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
        """This rank's batches (samples, without ``batch_size``) in the epoch, from its start."""
        return self.layout().steps

    def position(self, steps: int) -> dict[str, Any]:
        """The global position once every rank has taken ``steps`` batches of this epoch: the
        ``start=`` of a resume after a plain ``DataLoader`` (which keeps no state) took them."""
        return {"shardsmith": POSITION, **self._identity, "epoch": self.epoch,
                "position": self.layout().position_after(steps)}

    def _stream(self) -> tuple[int, int]:
        """(stream, streams) of the process this runs in: one stream here."""
        return 0, 1

    def _options(self) -> dict[str, Any]:
        worker, workers = self._stream()
        return {**self._identity, "batch_size": self.batch_size, "world_size": self.world_size,
                "drop_last": bool(self.drop_last), "rank": self.rank, "workers": workers, "worker": worker}

    def state_dict(self) -> dict[str, Any]:
        """How far this stream (this rank, or one DataLoader worker of it) has gone in the epoch."""
        return {"shardsmith": STATE, **self._options(), "epoch": self.epoch, "start": self.start,
                "produced": self._produced}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was saved (the next iteration starts there)."""
        check_state(state, self._options())
        self.epoch = self._start_epoch = int(state["epoch"])
        self._start = int(state["start"])
        self.layout()
        self._resume = self._produced = int(state["produced"])

    def indices(self) -> np.ndarray:
        """This epoch's whole order of item indices (every rank's)."""
        return self.order(self.n, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)

    def _walk(self) -> Iterator[np.ndarray]:
        """This stream's batches as index arrays. Runs eagerly (the saved position is taken now,
        once); the count goes up before each batch is handed over, so a state taken while the
        consumer holds batch k counts k + 1. ``_ahead()`` then gives every index still to come."""
        worker, workers = self._stream()
        layout = self.layout()
        order = self.indices()
        first, self._resume = self._resume, 0
        self._produced = first

        steps = range(worker + first * workers, layout.steps, workers)

        def batches() -> Iterator[np.ndarray]:
            for step in steps:
                indices = order[layout.positions(step)]
                self._produced += 1
                yield indices

        self._ahead = lambda: (np.concatenate([order[layout.positions(step)] for step in steps]) if len(steps)
                               else np.zeros(0, dtype=np.int64))
        return batches()
