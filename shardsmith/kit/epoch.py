"""``EpochStream``: one epoch's batches for one rank (or one DataLoader worker of it) from a start
position, and the state that resumes them. numpy and plain dicts only: the loader's pipeline
(``kit/pipeline.py``: ``ds.iter``, every iterable torch adapter, a mixture's), ``EpochBatchSampler``
and the torch-free ``BalancedSampler`` share it, so the epoch/start/layout/state rules exist once
(``kit/rank_split.py`` holds the layout and the checks).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from shardsmith.kit.rank_split import POSITION, STATE, EpochLayout, check_state, resolve_start, worker_steps

# (n, *, shuffle, seed, epoch) -> the epoch's order of item indices, with a ``name`` (``EpochOrder``)
Order = Callable[..., np.ndarray]


def distributed() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialised (torch is never imported here)."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def carried(state_epoch: int, asked: int) -> bool:
    """Whether a loaded state of epoch ``state_epoch`` is an earlier epoch's, carried to its end
    before epoch ``asked`` (the latest ``set_epoch``'s) starts, rather than one to resume in
    ``asked`` itself (the same epoch). A later epoch is refused: it would skip the epochs between.
    Decided when the iteration starts (``EpochStream._plan``), so neither the order of
    ``load_state_dict`` and ``set_epoch`` nor an earlier ``set_epoch`` matters: torchdata's
    ``StatefulDataLoader`` loads a state at ``iter()``, after the loop's ``set_epoch``."""
    if state_epoch > asked:
        raise ValueError(f"the loaded state_dict is of epoch {state_epoch}, after the epoch {asked} that "
                         f"set_epoch asked for: set_epoch({state_epoch}) resumes it")
    return state_epoch < asked


class EpochStream:
    """One epoch's batches for this rank from a start position, and the state that resumes them.

    ``order``: the epoch's order (``EpochOrder``, a mixture's or a balanced order; its ``name``
    goes into the state). ``start``: a position in the epoch's order (int, for epoch ``epoch``)
    or a ``global_position`` (which sets the epoch to its own); ``set_epoch`` to any other epoch
    starts at 0. ``state_dict()`` holds plain ints and strings; ``load_state_dict`` refuses a
    state of another dataset, order or layout.

    A loaded state waits for the next iteration (``state_dict()`` gives it back until then), which
    matches it against the epoch of the latest ``set_epoch`` (``carried``; none called: the state's
    own): the same epoch resumes; an earlier epoch is finished first, the iteration yielding what
    is left of it (nothing, for a state saved after its last batch), then the asked epoch from its
    start; a later one is refused, and the state still waits. ``set_epoch`` names the next
    iteration's epoch, so of two calls the latest wins, as without a state. The earlier epoch's
    rest is played rather than dropped because torchdata resumes from a snapshot and discards the
    batches yielded since, and starts at the worker after the last one that yielded: both count
    on it. ``len()`` is what the next iteration yields.

    Batches of step s go to stream ``(s + shift) % streams`` (``_stream``: one, unless a subclass
    runs in workers); ``shift`` is 0 but in an epoch that follows a carried one in one iteration.
    """

    def __init__(self, n: int, *, order: Order, batch_size: int | None, shuffle: bool, seed: int, epoch: int,
                 rank: int | None, world_size: int | None, start: int | Mapping[str, Any] | None,
                 drop_last: bool) -> None:
        self.n = n
        self.order = order
        self.batch_size = None if batch_size is None else operator.index(batch_size)  # numpy ints saved as ints
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        ranks = (rank, world_size) if rank is not None and world_size else distributed()
        self.rank, self.world_size = operator.index(ranks[0]), operator.index(ranks[1])
        self._identity = {"length": int(n), "order": order.name, "shuffle": bool(shuffle), "seed": int(seed)}
        self._start_epoch, self._start = resolve_start(start, epoch=epoch, identity=self._identity)
        self.epoch = self._start_epoch  # a global position sets the epoch it is in
        self.layout()  # refuse a bad rank, batch size or start now rather than in a worker
        self._produced = 0  # batches this stream has handed over in the running iteration
        self._shift = 0     # the stream of step 0 (see the class)
        self._asked = False  # set_epoch was called (a worker's copy has it too): its epoch is self.epoch
        self._pending: dict[str, int] | None = None  # a loaded state the next iteration starts from
        self._walking: dict[str, int] | None = None  # the carried epoch while the iteration is in it

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next (after the rest of a loaded state's earlier epoch: see the class)."""
        epoch = int(epoch)
        self._asked = True
        if epoch != self.epoch:
            self._produced = self._shift = 0
        self.epoch = epoch
        self._walking = None

    @property
    def start(self) -> int:
        return self._start if self.epoch == self._start_epoch else 0

    def layout(self, *, start: int | None = None) -> EpochLayout:
        return EpochLayout(total=self.n, start=self.start if start is None else start, batch_size=self.batch_size,
                           rank=self.rank, world_size=self.world_size, drop_last=self.drop_last)

    def __len__(self) -> int:
        """The batches (samples, without ``batch_size``) the next iteration yields: this rank's, in the
        main process; with a loaded state, from where it was saved (see the class). A
        ``StatefulDataLoader``'s own ``len()`` never sees its state (applied at ``iter()``): the epoch's."""
        return sum(len(steps) for _, _, steps in self._plan())

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

    def _saved(self) -> dict[str, int]:
        """Where this stream is: the epoch, its start, the stream of its step 0, batches handed over
        (a loaded state not yet iterated: that state)."""
        if self._pending is not None:
            return dict(self._pending)
        if self._walking is not None:
            return {**self._walking, "produced": self._produced}
        return {"epoch": self.epoch, "start": self.start, "shift": self._shift, "produced": self._produced}

    def state_dict(self) -> dict[str, Any]:
        """How far this stream (this rank, or one DataLoader worker of it) has gone in the epoch, and
        ``skipped``: the samples it replaced (the loader pipeline's skip policy, ``kit/skips.py``)."""
        return {"shardsmith": STATE, **self._options(), **self._saved(), "skipped": self._skip_records()}

    def _skip_records(self) -> list[dict[str, Any]]:
        """The samples this stream replaced in its epoch (a sampler reads nothing: none)."""
        return []

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was saved: the next iteration starts there, after the rest of its
        epoch if ``set_epoch`` asks for a later one (see the class). Without ``set_epoch`` the
        state's epoch becomes this one's."""
        fields = check_state(state, self._options())
        saved = {key: fields[key] for key in ("epoch", "start", "shift", "produced")}
        if saved["produced"] > worker_steps(fields, self.layout(start=saved["start"])):
            raise ValueError(f"state_dict 'produced' {saved['produced']} is more batches than this stream has "
                             f"in its epoch")
        self._pending, self._walking = saved, None
        if not self._asked:
            self.epoch = saved["epoch"]

    def _plan(self) -> list[tuple[dict[str, int], EpochLayout, range]]:
        """The next iteration of this stream: (where a part starts, its layout, its steps) for a
        loaded state's earlier epoch (if it has steps left), then for this epoch. The one place a
        loaded state meets ``set_epoch`` (``carried``; refused: raises)."""
        worker, workers = self._stream()
        state, parts = self._pending, []
        place = {"epoch": self.epoch, "start": self.start, "shift": 0, "produced": 0}
        if state is not None and carried(state["epoch"], self.epoch):
            layout = self.layout(start=state["start"])
            first = (worker - state["shift"]) % workers + state["produced"] * workers
            if first < layout.steps:
                parts.append((state, layout, range(first, layout.steps, workers)))
            place["shift"] = (state["shift"] + layout.steps) % workers  # this epoch's step 0 follows its last
        elif state is not None:
            place = state  # the same epoch: resume it (``_walk`` adopts its start)
        layout = self.layout(start=place["start"])
        first = (worker - place["shift"]) % workers + place["produced"] * workers
        return [*parts, (place, layout, range(first, layout.steps, workers))]

    def indices(self) -> Any:
        """This epoch's whole order of item indices (every rank's; unshuffled, ``Positions``)."""
        return self.order(self.n, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)

    def _walk(self) -> Iterator[np.ndarray]:
        """This stream's batches as index arrays (``_parts``: a carried epoch's rest, then this
        epoch's). The count goes up before each batch is handed over, so a state taken while the
        consumer holds batch k counts k + 1."""
        parts = self._parts()

        def batches() -> Iterator[np.ndarray]:
            for k, (order, layout, steps) in enumerate(parts):
                if k:
                    self._enter(k)
                for step in steps:
                    indices = order[layout.positions(step)]
                    self._produced += 1
                    yield indices

        return batches()

    def _parts(self) -> list[tuple[Any, EpochLayout, range]]:
        """(the order, its layout, this stream's steps) of each part of the next iteration (``_plan``),
        taken now, eagerly: the saved position is fixed when the iteration starts, and a state refused
        by ``set_epoch`` raises here rather than at the first batch. ``_enter(k)`` is called as part k
        starts; ``_ahead()`` then gives every index still to come."""
        plan = self._plan()
        own = plan[-1][0]
        parts = [(self.order(self.n, shuffle=self.shuffle, seed=self.seed, epoch=place["epoch"])
                  if k < len(plan) - 1 else self.indices(), layout, steps)
                 for k, (place, layout, steps) in enumerate(plan)]
        if own is self._pending:  # resumed in its own epoch: the state's start is this epoch's
            self._start_epoch, self._start = own["epoch"], own["start"]
        self._pending, self._shift = None, own["shift"]
        self._places = [place for place, _, _ in plan]
        self._enter(0)
        self._ahead_parts = parts
        return parts

    def _enter(self, k: int) -> None:
        """Part k of the running iteration starts: what ``state_dict`` says is now its place."""
        place = self._places[k]
        self._walking = None if k == len(self._places) - 1 else {key: place[key] for key in ("epoch", "start", "shift")}
        self._produced = place["produced"]

    def _ahead(self) -> np.ndarray:
        """Every index the running iteration has still to hand over, in order (computed at once)."""
        runs = [order[layout.positions_of(steps)] for order, layout, steps in self._ahead_parts]
        return np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)
