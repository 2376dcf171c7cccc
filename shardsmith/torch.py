"""torch adapters over the numpy loaders: iterables that deal one epoch's batches to DDP ranks and
DataLoader workers (one per kind of sample, and ``Batches`` for any loader dataset), map-style
windows with batched fetch, and a batch sampler; all of them resume.

The iterables are the loader's one pipeline (``shardsmith.kit.pipeline``), as ``ds.iter`` is: rank
r's batch s is a fixed run of the epoch's order (``shardsmith.kit.rank_split``), whatever the
worker count, and DataLoader worker w makes batches s ≡ w (mod workers), so the DataLoader yields
the same batches in the same order for any ``num_workers``, and the samples ``ds.iter`` gives
the same rank. ``state_dict`` counts the batches a worker has handed over (torchdata's
``StatefulDataLoader`` keeps one per worker and resumes exactly); ``global_position`` turns the
ranks' saved states into one position in the epoch's order, and ``start=`` starts any rank and
worker layout there (elastic resume).

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
from shardsmith.formats.event_tar.dataset import EventTarDataset
from shardsmith.formats.hdf5.dataset import BLOCK, EventBatch, EventDataset, block_order
from shardsmith.formats.memmap.dataset import MemmapDataset
from shardsmith.formats.tokens.dataset import TokenDataset
from shardsmith.formats.tokens.packed import PackedSequences, varlen_batch
from shardsmith.formats.webdataset.dataset import TarDataset
from shardsmith.kit import dataset as loader_dataset
from shardsmith.kit.epoch import EpochStream
from shardsmith.kit.pipeline import EpochPipeline
from shardsmith.kit.rank_split import EpochOrder, global_position, skip_report
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

__all__ = ["BalancedSampler", "Batches", "DecodeAugment", "DevicePrefetcher", "EpochBatchSampler", "EventBatches",
           "EventSamples", "EventTarBatches", "JpegBatch", "JpegCollate", "MemmapBatches", "MixBatches",
           "PackedBatches", "RandomResizedCropFlip", "TarIterable", "TarSamples", "TokenBatches", "TokenWindows",
           "decode_jpegs", "event_collate", "global_position", "loader", "map_tensors", "skip_report",
           "to_model_input", "varlen_collate"]

# torchdata 0.11's StatefulDataLoader calls torch.set_vital, which newer torch deprecates with a UserWarning for
# every loader made: neither a user nor shardsmith can act on it, so that one warning from that one module is off.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning,
                        module=r"torchdata\.stateful_dataloader")


def _to_torch(value: Any) -> Any:
    """numpy arrays (in dicts and tuples too) as tensors; anything else as it is."""
    if isinstance(value, np.ndarray):
        if not value.dtype.isnative:  # e.g. big-endian ROOT floats: torch takes native order only
            value = value.astype(value.dtype.newbyteorder("="))
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_to_torch(v) for v in value)
    return value


class Batches(EpochPipeline, IterableDataset):
    """Batches (or, without ``batch_size``, samples) of one epoch of any loader dataset
    (``shardsmith.kit.dataset``: every format's, a mixture, a plugin's), dealt to DDP ranks and
    DataLoader workers; use the DataLoader's ``batch_size=None``.

    The same batches in the same order for any ``num_workers``, and the samples ``ds.iter`` gives
    this rank; every rank gets as many (``drop_last``: the positions after the last whole
    ``world_size × batch_size`` step are dropped; else each rank also gets one short batch).
    ``start=``: a position, or a ``global_position`` (elastic resume). ``collate`` runs on each
    batch in the worker; without it a batch of arrays (token windows, memmap events) becomes tensors
    and other batches (lists of samples, ``EventBatch``) come as they are. The kind's adapters below
    are this class with their kind's defaults, and pass ``on_error``, ``max_skipped`` and ``verify``
    (the skip policy, ``kit/skips.py``) on to it.
    """

    def __init__(self, dataset: Any, *, batch_size: int | None, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True,
                 collate: Callable[[Any], Any] | None = None, order: EpochOrder | None = None,
                 on_error: str = "raise", max_skipped: int | float = 0.01, verify: str | None = None) -> None:
        if not isinstance(dataset, loader_dataset.Dataset):
            raise TypeError(f"{type(self).__name__} reads a loader dataset (shardsmith.kit.dataset.Dataset: a "
                            f"shardsmith dataset, a mixture or a plugin's), not a {type(dataset).__name__}")
        if collate is None and dataset.kind.form.arrays:
            collate = _to_torch
        super().__init__(dataset, order=dataset.epoch_order() if order is None else order, batch_size=batch_size,
                         shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size, start=start,
                         drop_last=drop_last, collate=collate, on_error=on_error, max_skipped=max_skipped,
                         verify=verify)

    def _stream(self) -> tuple[int, int]:
        """(worker, workers) of the process this runs in (0 of 1 outside DataLoader workers)."""
        info = get_worker_info()
        return (info.id, info.num_workers) if info else (0, 1)

    def __iter__(self) -> Iterator[Any]:
        return self._run()  # the parts taken now: the saved position is fixed when iteration starts


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


class TokenBatches(Batches):
    """Batches of windows (x, y) of one epoch of a TokenDataset, as tensors (``Batches``; use the
    DataLoader's ``batch_size=None``). ``drop_last=True`` by default: every batch has ``batch_size``
    windows."""

    def __init__(self, dataset: TokenDataset, *, batch_size: int, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True, **checks: Any) -> None:
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, start=start, drop_last=drop_last, **checks)


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


class PackedBatches(Batches):
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
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True, **checks: Any) -> None:
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, start=start, drop_last=drop_last, collate=varlen_collate, **checks)


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


class TarIterable(Batches):
    """Samples (or, with ``batch_size``, lists of them, or ``collate(list)``) of one epoch of a TarDataset.

    Give ``batch_size`` here (and ``batch_size=None`` to the DataLoader) for batches that do not
    depend on ``num_workers``, and for ``global_position`` with several workers. Without it,
    samples come one at a time (``collate`` on each, if given), sliced ahead out of the shards.
    """

    def __init__(self, dataset: TarDataset, *, batch_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = False,
                 collate: Callable[[Any], Any] | None = None, **checks: Any) -> None:
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, start=start, drop_last=drop_last, collate=collate, **checks)


class EventTarBatches(TarIterable):
    """Events (dicts of arrays) of one epoch of an EventTarDataset, one at a time or, with
    ``batch_size``, in lists (``collate=event_collate(schema=ds.schema)``: tensors, one event per
    sample), dealt as ``TarIterable`` deals tar samples."""

    def __init__(self, dataset: EventTarDataset, *, batch_size: int | None = None, shuffle: bool = True,
                 seed: int = 0, epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = False,
                 collate: Callable[[Any], Any] | None = None, **checks: Any) -> None:
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, start=start, drop_last=drop_last, collate=collate, **checks)


class MemmapBatches(Batches):
    """Batches of one epoch of a MemmapDataset as tensors (``{"values": (B, L, F), "lengths",
    "counts", "scalars": {name: (B, ...)}}``; ``collate`` instead, if given), dealt as ``Batches``
    deals them; the order is a per-event permutation."""

    def __init__(self, dataset: MemmapDataset, *, batch_size: int, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = False,
                 collate: Callable[[Any], Any] | None = None, **checks: Any) -> None:
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, start=start, drop_last=drop_last, collate=collate, **checks)


# -- events (HDF5 event shards) -------------------------------------------------------------------

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


class EventBatches(Batches):
    """Batches of one epoch of an EventDataset, dealt to DDP ranks and DataLoader workers.

    The order is contiguous blocks of ``block`` events in shuffled order (``event_order``;
    ``exact=True``: a per-event permutation); rank r's batch s is a fixed run of it and batch s
    goes to worker ``s % num_workers``, so the DataLoader yields the single-process batches for
    any worker count. ``collate`` (e.g. ``event_collate()``) runs in the workers; without it an
    ``EventBatch`` is yielded. Use the DataLoader's ``batch_size=None``.
    """

    def __init__(self, dataset: EventDataset, *, batch_size: int, block: int = BLOCK, exact: bool = False,
                 drop_last: bool = False, collate: Callable[[EventBatch], Any] | None = None,
                 shuffle: bool = True, seed: int = 0, epoch: int = 0, rank: int | None = None,
                 world_size: int | None = None, start: int | Mapping[str, Any] | None = None, **checks: Any) -> None:
        self.block = block
        self.exact = exact
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, start=start, drop_last=drop_last, collate=collate,
                         order=block_order(block, exact), **checks)


# -- weighted mixtures (shardsmith.loader.mix) --------------------------------------------------

class MixBatches(Batches):
    """Batches of a ``Mixture`` in its order, dealt to ranks and workers as the other adapters do
    (same ``state_dict``, ``global_position``, ``start=``). To change weights at a resume point,
    ``m.state(global_position(states)["position"])`` is the ``start=`` of the new ``mix``. The
    mixture is one epoch (``set_epoch`` repeats it): for more, a larger ``num_samples``, or the
    next mixture from ``m.state(len(m))``, whose sources continue into new shuffled passes."""

    def __init__(self, mixture: Any, *, batch_size: int, rank: int | None = None, world_size: int | None = None,
                 start: int | Mapping[str, Any] | None = None, drop_last: bool = True,
                 collate: Callable[[Any], Any] | None = None, **checks: Any) -> None:
        super().__init__(mixture, batch_size=batch_size, shuffle=False, seed=mixture.seed, epoch=0, rank=rank,
                         world_size=world_size, start=start, drop_last=drop_last, collate=collate, **checks)
