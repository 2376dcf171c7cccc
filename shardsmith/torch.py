"""torch adapters over the numpy loaders: map-style windows with batched fetch, iterables that deal
one epoch's batches to DDP ranks and DataLoader workers, and a batch sampler; all of them resume.

The layout (``shardsmith.kit.rank_split``): rank r's batch s is a fixed run of the epoch's order,
whatever the worker count, and DataLoader worker w makes batches s ≡ w (mod workers), so the
DataLoader yields the same batches in the same order for any ``num_workers``. ``state_dict`` counts
the batches a worker has handed over (torchdata's ``StatefulDataLoader`` keeps one per worker and
resumes exactly); ``global_position`` turns the ranks' saved states into one position in the
epoch's order, and ``start=`` starts any rank and worker layout there (elastic resume).

Import cost stays out of ``import shardsmith``: only this module imports torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from shardsmith.torch_extra import torch_missing

try:
    import torch
    from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info
except ImportError:
    raise torch_missing(__name__) from None

from shardsmith.core.events import EventSchema
from shardsmith.formats.hdf5.dataset import EventBatch, EventDataset
from shardsmith.formats.tokens.dataset import TokenDataset
from shardsmith.formats.tokens.packed import PackedSequences, varlen_batch
from shardsmith.formats.webdataset.dataset import TarDataset
from shardsmith.kit.epoch import EpochStream
from shardsmith.kit.rank_split import EpochOrder, global_position
from shardsmith.loader.balance_sampler import BalancedSampler
from shardsmith.torch_feed import DevicePrefetcher, map_tensors
from shardsmith.torch_images import (
    DecodeAugment,
    JpegBatch,
    JpegCollate,
    RandomResizedCropFlip,
    decode_jpegs,
    to_model_input,
)

__all__ = ["BalancedSampler", "DecodeAugment", "DevicePrefetcher", "EpochBatchSampler", "EventBatches", "EventSamples",
           "JpegBatch", "JpegCollate", "MixBatches", "PackedBatches", "RandomResizedCropFlip", "TarIterable",
           "TarSamples", "TokenBatches", "TokenWindows", "decode_jpegs", "event_collate", "global_position", "loader",
           "map_tensors", "to_model_input", "varlen_collate"]

# torchdata 0.11's StatefulDataLoader calls torch.set_vital, which newer torch deprecates with a UserWarning for
# every loader made: neither a user nor shardsmith can act on it, so that one warning from that one module is off.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning,
                        module=r"torchdata\.stateful_dataloader")


class _Epoch(EpochStream):
    """``EpochStream`` (``kit/epoch.py``) whose streams are the DataLoader's workers."""

    def _stream(self) -> tuple[int, int]:
        """(worker, workers) of the process this runs in (0 of 1 outside DataLoader workers)."""
        info = get_worker_info()
        return (info.id, info.num_workers) if info else (0, 1)


class _EpochIterable(_Epoch, IterableDataset):
    """An iterable adapter: ``_make`` turns one batch's indices into what the DataLoader gets."""

    def __iter__(self) -> Iterator[Any]:
        return self._streamed(self._walk())  # _walk now: the saved position is taken when iteration starts

    def _streamed(self, batches: Iterator[np.ndarray]) -> Iterator[Any]:
        """The batches made; a streamed dataset (``shardsmith.loader.open(url, ...)``) is told this
        stream's order first, to fetch its shards ahead, and lets go of its cached shards at the end
        (a worker waiting for the others holds none)."""
        prefetch, release = getattr(self.dataset, "prefetch", None), getattr(self.dataset, "release", None)
        if prefetch is not None:
            prefetch(self._ahead())
        yield from map(self._make, batches)
        if release is not None:
            release()

    def _make(self, indices: np.ndarray) -> Any:
        raise NotImplementedError


class EpochBatchSampler(EpochStream, Sampler):
    """A resumable batch sampler for the map-style adapters: ``DataLoader(ds, batch_sampler=...)``.

    Yields this rank's batches of one epoch as index lists, in the layout of the iterable adapters
    (``start=``, ``global_position``, ``drop_last`` alike). It runs in the main process, so its
    ``state_dict`` counts the batches handed to the workers; torchdata's ``StatefulDataLoader``
    pairs that with the batch it yields. ``block``: contiguous blocks in shuffled order (events).
    """

    def __init__(self, n: int | Any, *, batch_size: int, shuffle: bool = True, seed: int = 0, epoch: int = 0,
                 rank: int | None = None, world_size: int | None = None, start: int | Mapping[str, Any] | None = None,
                 drop_last: bool = True, block: int | None = None) -> None:
        super().__init__(n if isinstance(n, int) else len(n), order=EpochOrder(block), batch_size=batch_size,
                         shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size, start=start,
                         drop_last=drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        return (indices.tolist() for indices in self._walk())


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


class TokenBatches(_EpochIterable):
    """Batches of windows (x, y) of one epoch of a TokenDataset (use the DataLoader's ``batch_size=None``).

    The same batches in the same order for any ``num_workers``; every rank gets the same number
    (``drop_last=True``: the positions after the last whole ``world_size × batch_size`` step are
    dropped). ``start=``: a position, or a ``global_position`` (elastic resume).
    """

    def __init__(self, dataset: TokenDataset, *, batch_size: int, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True) -> None:
        self.dataset = dataset
        super().__init__(len(dataset), order=EpochOrder(), batch_size=batch_size, shuffle=shuffle, seed=seed,
                         epoch=epoch, rank=rank, world_size=world_size, start=start, drop_last=drop_last)

    def _make(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.dataset.get_batch(indices)
        return torch.from_numpy(x), torch.from_numpy(y)


def varlen_collate(items: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Packed sequences (``PackedSequences`` items, or a ``MixBatches`` batch of a mixture of packed
    datasets) into one varlen batch of tensors: ``tokens`` (B, N), flat int32 ``cu_seqlens`` with
    each row's padding as a segment of its own, ``max_seqlen``, ``real`` (B,), ``position_ids``,
    ``loss_mask`` and ``labels`` (``formats/tokens/packed.py`` ``varlen_batch``; an item without a
    loss mask, as a pre-training source of a mixture, trains on its real tokens)."""
    if not items:
        raise ValueError("varlen_collate: an empty batch")
    batch = varlen_batch(items, seq_len=len(items[0]["tokens"]))
    return {k: v if isinstance(v, int) else torch.from_numpy(v) for k, v in batch.items()}


class PackedBatches(_EpochIterable):
    """Batches of packed sequences (``pack-tokens --pack best-fit``) of one epoch, for varlen attention.

    Each batch is a dict: ``tokens`` int64 (B, N); ``cu_seqlens`` int32, **flat over the batch**
    (row j's document ends + j·N, its padding tail as one more segment, last entry B·N), as
    ``flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen)`` takes it for
    ``tokens.reshape(-1)``; ``max_seqlen`` (int); ``real`` int32 (B,): row j's tokens from
    ``real[j]`` on are padding (mask them out of the loss); ``position_ids`` (B, N), restarting at
    every segment; ``loss_mask`` bool (B, N), the tokens the loss counts (a chat dataset's bits, else
    every real token) and ``labels`` int64 (B, N): the tokens where the loss counts them, -100
    elsewhere and at the first token of every segment (no token is predicted across a packed
    boundary; unshifted, as HF models take ``labels``). A row's own boundaries stay
    ``dataset.cu_seqlens(i)``. Dealt, resumed
    (``state_dict``, ``global_position``, ``start=``) and independent of ``num_workers`` as
    ``TokenBatches``; use the DataLoader's ``batch_size=None``.
    """

    def __init__(self, dataset: PackedSequences, *, batch_size: int, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True) -> None:
        self.dataset = dataset
        super().__init__(len(dataset), order=EpochOrder(), batch_size=batch_size, shuffle=shuffle, seed=seed,
                         epoch=epoch, rank=rank, world_size=world_size, start=start, drop_last=drop_last)

    def _make(self, indices: np.ndarray) -> dict[str, Any]:
        return varlen_collate(self.dataset.get_batch(indices))


def loader(dataset: TokenDataset, *, batch_size: int, shuffle: bool = True, seed: int = 0, epoch: int = 0,
           num_workers: int = 0, start: int | Mapping[str, Any] | None = None, drop_last: bool = True,
           **kwargs: Any) -> torch.utils.data.DataLoader:
    """A DataLoader over ``TokenBatches`` for this process's DDP rank."""
    return torch.utils.data.DataLoader(
        TokenBatches(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, start=start,
                     drop_last=drop_last),
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


class TarIterable(_EpochIterable):
    """Samples (or, with ``batch_size``, lists of them, or ``collate(list)``) of one epoch of a TarDataset.

    Give ``batch_size`` here (and ``batch_size=None`` to the DataLoader) for batches that do not
    depend on ``num_workers``, and for ``global_position`` with several workers.
    """

    def __init__(self, dataset: TarDataset, *, batch_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = False,
                 collate: Callable[[list[dict[str, Any]]], Any] | None = None) -> None:
        self.dataset = dataset
        self.collate = collate
        super().__init__(len(dataset), order=EpochOrder(), batch_size=batch_size, shuffle=shuffle, seed=seed,
                         epoch=epoch, rank=rank, world_size=world_size, start=start, drop_last=drop_last)

    def _make(self, indices: np.ndarray) -> Any:
        if self.batch_size is None:
            return self.dataset[int(indices[0])]
        batch = self.dataset.get_batch(indices)
        return self.collate(batch) if self.collate is not None else batch


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
    from shardsmith.kit.collate import RAGGED, TRUNCATE, collate_events

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


class EventBatches(_EpochIterable):
    """Batches of one epoch of an EventDataset, dealt to DDP ranks and DataLoader workers.

    The order is contiguous blocks of ``block`` events in shuffled order (``event_order``;
    ``exact=True``: a per-event permutation); rank r's batch s is a fixed run of it and batch s
    goes to worker ``s % num_workers``, so the DataLoader yields the single-process batches for
    any worker count. ``collate`` (e.g. ``event_collate()``) runs in the workers; without it an
    ``EventBatch`` is yielded. Use the DataLoader's ``batch_size=None``.
    """

    def __init__(self, dataset: EventDataset, *, batch_size: int, block: int = 256, exact: bool = False,
                 drop_last: bool = False, collate: Callable[[EventBatch], Any] | None = None,
                 shuffle: bool = True, seed: int = 0, epoch: int = 0, rank: int | None = None,
                 world_size: int | None = None, start: int | Mapping[str, Any] | None = None) -> None:
        if block < 1:
            raise ValueError(f"block={block}: must be at least 1")
        self.dataset = dataset
        self.block = block
        self.exact = exact
        self.collate = collate
        super().__init__(len(dataset), order=EpochOrder(None if exact else block), batch_size=batch_size,
                         shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size, start=start,
                         drop_last=drop_last)

    def _make(self, indices: np.ndarray) -> Any:
        batch = self.dataset.get_batch(indices)
        return self.collate(batch) if self.collate is not None else batch


# -- weighted mixtures (shardsmith.loader.mix) --------------------------------------------------

class MixBatches(_EpochIterable):
    """Batches of a ``Mixture`` in its order, dealt to ranks and workers as the other adapters do
    (same ``state_dict``, ``global_position``, ``start=``). To change weights at a resume point,
    ``m.state(global_position(states)["position"])`` is the ``start=`` of the new ``mix``. The
    mixture is one epoch (``set_epoch`` repeats it): for more, a larger ``num_samples``, or the
    next mixture from ``m.state(len(m))``, whose sources continue into new shuffled passes."""

    def __init__(self, mixture: Any, *, batch_size: int, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True,
                 collate: Callable[[Any], Any] | None = None) -> None:
        self.dataset = mixture
        self.collate = collate
        super().__init__(len(mixture), order=mixture.order, batch_size=batch_size, shuffle=False,
                         seed=mixture.seed, epoch=0, rank=rank, world_size=world_size, start=start,
                         drop_last=drop_last)

    def _make(self, indices: np.ndarray) -> Any:
        batch = self.dataset.get_batch(indices)
        if self.collate is not None:
            return self.collate(batch)
        return tuple(_to_torch(v) for v in batch) if isinstance(batch, tuple) else batch
