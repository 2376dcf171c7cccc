"""The one epoch pipeline: order, rank layout, batches, fetch, (skip policy), collate.

``EpochPipeline`` is an ``EpochStream`` (``kit/epoch.py``: the epoch's order, the rank layout of
``kit/rank_split.py``, the steps of this stream and the state that resumes them) that also reads
what it deals from a dataset of the protocol (``kit/dataset.py``). ``ds.iter`` (``EpochIterator``),
every torch adapter (``shardsmith.torch``: streams are DataLoader workers) and a mixture's adapter
are this class, so the same (dataset, order, shuffle, seed, epoch, rank, world size, batch size)
gives the same samples by every road, with one state format (``rank_split.STATE``).

Steps:
1. order: ``order(n, shuffle, seed, epoch)``, every rank's (``EpochOrder``);
2. rank layout: rank r's batch s is the r-th run of ``batch_size`` positions of global step s
   (``EpochLayout``; without ``batch_size``, runs of one: a stride), stream w of W takes steps
   s ≡ w (mod W);
3. fetch (``Fetch``): ``dataset.read(indices)`` per batch, or ``dataset.samples(indices)`` for the
   whole run of single samples (one pass that a dataset may read ahead in);
4. skip policy: where a sample that cannot be read will be replaced and recorded (issue 44,
   item 3): ``Fetch`` is the one place that reads, and the state has its ``skipped`` list;
5. collate: ``collate(batch)`` (an adapter's tensors, a user's function), in the stream's process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from shardsmith.kit.epoch import EpochStream
from shardsmith.kit.rank_split import EpochOrder


class Fetch:
    """The pipeline's reads of ``dataset``: the step a skip policy wraps (module, step 4)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def batch(self, indices: np.ndarray) -> Any:
        return self.dataset.read(indices)

    def samples(self, indices: np.ndarray) -> Iterator[Any]:
        return self.dataset.samples(indices)


def order_name(order: EpochOrder, dataset: Any) -> str:
    """What a state calls the order of ``dataset``: the order's name, prefixed by the dataset's
    ``fingerprint`` when it has one (a mixture's ``mix:…``; read in order, the fingerprint alone)."""
    fingerprint = dataset.fingerprint
    if fingerprint is None:
        return order.name
    return fingerprint if order.name == "permutation" else f"{fingerprint}:{order.name}"


class _Named:
    """An order under another name (``order_name``): the same positions."""

    def __init__(self, order: EpochOrder, name: str) -> None:
        self.inner, self.name = order, name

    def __call__(self, n: int, *, shuffle: bool, seed: int, epoch: int) -> Any:
        return self.inner(n, shuffle=shuffle, seed=seed, epoch=epoch)


class EpochPipeline(EpochStream):
    """One epoch of ``dataset`` for this rank and stream, read and collated (see the module).

    ``batch_size=None``: single samples (``dataset.samples``), else batches (``dataset.read``);
    ``collate`` runs on each. Without ``rank``/``world_size`` they come from torch.distributed.
    """

    def __init__(self, dataset: Any, *, order: EpochOrder, batch_size: int | None, shuffle: bool, seed: int,
                 epoch: int, rank: int | None, world_size: int | None, start: int | Mapping[str, Any] | None,
                 drop_last: bool, collate: Callable[[Any], Any] | None = None) -> None:
        self.dataset = dataset
        self.collate = collate
        self.fetch = Fetch(dataset)
        super().__init__(len(dataset), order=_Named(order, order_name(order, dataset)), batch_size=batch_size,
                         shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size, start=start,
                         drop_last=drop_last)

    def _run(self) -> Iterator[Any]:
        """The next iteration (``_parts`` taken now: a refused state raises here, not at the first
        item); a streamed dataset is told this stream's indices first, to fetch its shards ahead, and
        lets go of its cached shards at the end (a worker waiting for the others holds none)."""
        parts = self._parts()
        prefetch = self.dataset.prefetch
        if prefetch is not None:
            prefetch(self._ahead())
        return self._items(parts)

    def _items(self, parts: list[Any]) -> Iterator[Any]:
        """Each part's items, fetched and collated; the count goes up before each is handed over (a
        state taken while the consumer holds item k counts k + 1)."""
        collate = self.collate
        for k, (order, layout, steps) in enumerate(parts):
            if k:
                self._enter(k)
            if self.batch_size is None:  # single samples: one pass over the part, read ahead by the dataset
                items = self.fetch.samples(order[layout.positions_of(steps)])
            else:
                items = (self.fetch.batch(order[layout.positions(step)]) for step in steps)
            for item in items if collate is None else map(collate, items):
                self._produced += 1
                yield item
        release = self.dataset.release
        if release is not None:
            release()


class EpochIterator:
    """``ds.iter(...)``: an ``EpochPipeline`` in this process (one stream) as an iterator. ``next``
    starts the iteration (from a loaded state, if any) and goes on with it; ``load_state_dict`` and
    ``set_epoch`` make the next ``next`` start anew; once the epoch is over it stays over. ``len()``:
    the epoch's items for this rank from its start (a loaded state: what is left).

    It holds the pipeline and its running iteration, and neither holds it: an iterator dropped
    mid-epoch frees its dataset's open files at once, not at the next garbage collection."""

    def __init__(self, dataset: Any, *, order: EpochOrder, batch_size: int | None, shuffle: bool, seed: int,
                 epoch: int, rank: int, world_size: int, start: int | Mapping[str, Any] | None = None,
                 drop_last: bool = False, collate: Callable[[Any], Any] | None = None) -> None:
        self.pipeline = EpochPipeline(dataset, order=order, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                      epoch=epoch, rank=rank, world_size=world_size, start=start,
                                      drop_last=drop_last, collate=collate)
        self._items: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        """The running iteration itself (started if need be): a ``for`` loop pulls from it directly."""
        if self._items is None:
            self._items = self.pipeline._run()
        return self._items

    def __next__(self) -> Any:
        return next(iter(self))

    def __len__(self) -> int:
        return len(self.pipeline)

    @property
    def epoch(self) -> int:
        return self.pipeline.epoch

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next (``EpochStream.set_epoch``)."""
        self.pipeline.set_epoch(epoch)
        self._items = None

    def position(self, steps: int) -> dict[str, Any]:
        """The global position once every rank has taken ``steps`` items (``EpochStream.position``)."""
        return self.pipeline.position(steps)

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and strings (JSON will do): how far this rank has gone in the epoch."""
        return self.pipeline.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was saved (of this dataset, order and layout; else ValueError)."""
        self.pipeline.load_state_dict(state)
        self._items = None
