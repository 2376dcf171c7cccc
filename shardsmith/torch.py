"""torch adapters over the numpy loaders: map-style windows with batched fetch, and an iterable that
splits one epoch's order across DDP ranks and DataLoader workers without duplicates.

Import cost stays out of ``import shardsmith``: only this module imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from shardsmith.core.events import EventSchema
from shardsmith.formats.hdf5.dataset import EventBatch, EventDataset, event_order
from shardsmith.formats.order import epoch_order
from shardsmith.formats.tokens.dataset import TokenDataset
from shardsmith.formats.webdataset.dataset import TarDataset


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class TokenWindows(Dataset):
    """Map-style windows for ``DataLoader(..., batch_size=B)``: the batch is fetched by one gather."""

    def __init__(self, dataset: TokenDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.dataset[i]
        return torch.from_numpy(x), torch.from_numpy(y)

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = self.dataset.get_batch(np.asarray(indices))
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        return [(xt[k], yt[k]) for k in range(len(indices))]


class _EpochSlices(IterableDataset):
    """One epoch's permutation split over DDP ranks × DataLoader workers.

    Every (rank, worker) pair takes a strided slice of the same permutation: equal shares per
    rank first (the remainder dropped), then each rank's share dealt to its workers, so together
    they make one pass without duplicates. Call ``set_epoch`` between epochs.
    """

    def __init__(self, dataset: Any, *, batch_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = epoch
        self.rank, self.world_size = (rank, world_size) if rank is not None and world_size else _distributed()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _slice(self) -> np.ndarray:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        mine = epoch_order(len(self.dataset), shuffle=self.shuffle, seed=self.seed, epoch=self.epoch,
                           rank=self.rank, world_size=self.world_size)
        return mine[worker::workers]


class TokenBatches(_EpochSlices):
    """Batches of windows (x, y) for one epoch of a TokenDataset (use the DataLoader's ``batch_size=None``)."""

    def __init__(self, dataset: TokenDataset, *, batch_size: int, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=batch_size, **kwargs)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._slice()
        self.dataset.prefetch(order)  # a streamed dataset fetches the shards of this order ahead
        for start in range(0, len(order), self.batch_size):
            x, y = self.dataset.get_batch(order[start:start + self.batch_size])
            yield torch.from_numpy(x), torch.from_numpy(y)
        self.dataset.release()  # done: a worker waiting for the others holds no cached shard


def loader(dataset: TokenDataset, *, batch_size: int, shuffle: bool = True, seed: int = 0, epoch: int = 0,
           num_workers: int = 0, **kwargs: Any) -> torch.utils.data.DataLoader:
    """A DataLoader over ``TokenBatches`` for this process's DDP rank."""
    return torch.utils.data.DataLoader(
        TokenBatches(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch),
        batch_size=None, num_workers=num_workers, **kwargs)


class TarSamples(Dataset):
    """Map-style samples (dicts) of a ``TarDataset``; ``__getitems__`` fetches a DataLoader batch at once.

    Samples hold bytes, so pass a ``collate_fn`` that decodes (or ``collate_fn=list``).
    """

    def __init__(self, dataset: TarDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.dataset[i]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return self.dataset.get_batch(indices)


class TarIterable(_EpochSlices):
    """Samples (or lists of them, with ``batch_size``) for one epoch of a TarDataset."""

    def __iter__(self) -> Iterator[Any]:
        order = self._slice()
        self.dataset.prefetch(order)  # a streamed dataset fetches the shards of this order ahead
        if self.batch_size is None:
            for i in order:
                yield self.dataset[int(i)]
        else:
            for start in range(0, len(order), self.batch_size):
                yield self.dataset.get_batch(order[start:start + self.batch_size])
        self.dataset.release()  # done: a worker waiting for the others holds no cached shard


# -- events (HDF5 event shards) -------------------------------------------------------------------

def _to_torch(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if not value.dtype.isnative:  # e.g. big-endian ROOT floats: torch takes native order only
            value = value.astype(value.dtype.newbyteorder("="))
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    return value


def event_collate(*, ragged: str = "pad", max_len: int | None = None, truncate: str = "tail", pad_value: Any = 0,
                  schema: EventSchema | None = None) -> Callable[[Any], dict[str, Any]]:
    """A DataLoader ``collate_fn``: an ``EventBatch`` (or a list of events, given ``schema``) into
    tensors, ragged fields padded with a mask or flat with ``cu_seqlens`` (see ``collate_events``)."""
    from shardsmith.formats.collate import RAGGED, TRUNCATE, collate_events

    if ragged not in RAGGED or truncate not in TRUNCATE:
        raise ValueError(f"ragged={ragged!r}, truncate={truncate!r}: choose from {RAGGED} and {TRUNCATE}")

    def collate(batch: Any) -> dict[str, Any]:
        return _to_torch(collate_events(batch, ragged=ragged, max_len=max_len, truncate=truncate,
                                        pad_value=pad_value, schema=schema))

    return collate


class EventSamples(Dataset):
    """Map-style events of an ``EventDataset``; a DataLoader batch is fetched by one ``get_batch``.

    ``__getitems__`` returns an ``EventBatch``, so pass ``collate_fn=event_collate(...)``. Each
    DataLoader worker opens its own files (the dataset reopens them after a fork).
    """

    def __init__(self, dataset: EventDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.dataset[i]

    def __getitems__(self, indices: list[int]) -> EventBatch:
        return self.dataset.get_batch(np.asarray(indices, dtype=np.int64))


class EventBatches(_EpochSlices):
    """Batches of one epoch of an EventDataset, split over DDP ranks and DataLoader workers.

    The order is ``event_order`` (contiguous blocks in shuffled order by default, ``exact=True``
    for a per-event permutation); the rank's share is cut into batches and batch k goes to
    worker ``k % num_workers``, so together the workers yield every event of the share once, in
    the single-process order. ``collate`` (e.g. ``event_collate()``) runs in the workers; without
    it an ``EventBatch`` is yielded. Use the DataLoader's ``batch_size=None``.
    """

    def __init__(self, dataset: EventDataset, *, batch_size: int, block: int = 256, exact: bool = False,
                 drop_last: bool = False, collate: Callable[[EventBatch], Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self.block = block
        self.exact = exact
        self.drop_last = drop_last
        self.collate = collate

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        order = event_order(len(self.dataset), shuffle=self.shuffle, seed=self.seed, epoch=self.epoch,
                            rank=self.rank, world_size=self.world_size, block=self.block, exact=self.exact)
        bs = self.batch_size
        stop = len(order) - len(order) % bs if self.drop_last else len(order)
        mine = range(worker * bs, stop, workers * bs)
        if len(mine):  # a streamed dataset fetches the shards of this worker's batches ahead
            self.dataset.prefetch(np.concatenate([order[a:min(a + bs, stop)] for a in mine]))
        for start in mine:
            batch = self.dataset.get_batch(order[start:start + bs])
            yield self.collate(batch) if self.collate is not None else batch
        self.dataset.release()  # done: a worker waiting for the others holds no cached shard
