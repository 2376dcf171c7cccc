"""The dataset protocol the loader builds on: what every format's dataset is, and what a plugin
format implements to get ``ds.iter``, the torch adapters and mixtures.

A dataset has a length, ``read(indices) -> batch`` (the samples at those indices, in that order,
as one batch of its ``kind``: ``kit/sample_kind.py``), and the kind of its samples. Optional:
``prefetch(indices)`` (the indices this process reads next, in order: a streamed dataset fetches
their shards ahead) and ``release()`` (let go of what it holds open: a streamed dataset's cache
may then evict it), None where a dataset has nothing to do; ``samples(indices)`` (the samples one
at a time, for iteration without batches; by default ``ds[i]`` each) and ``__getitem__`` (by
default sample 0 of ``read([i])``); ``origin(i)`` (the shard and key that name sample i in an error
and in a skip report) and ``verify_samples(indices)`` (a per-sample hash check, where the format
records one: ``kit/skips.py``); ``samples_mended(indices, mend=...)`` (``samples`` that hands
``mend(index, error)`` in place of a sample whose read raises ``DatasetError`` and goes on, and
counts in ``position`` the samples handed over: the pipeline's road of single samples then runs
with no Python frame of its own per sample), None where a dataset has no such walk. ``fingerprint`` names what, besides its length, a saved
position depends on (a mixture's weights and sources); None for a dataset of shards.

Everything that walks an epoch runs on one pipeline (``kit/pipeline.py``): ``ds.iter`` here, the
torch adapters and a mixture's, so the same rank, seed and epoch give the same samples by every road.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from shardsmith.kit.rank_split import EpochOrder
from shardsmith.kit.sample_kind import SampleKind

if TYPE_CHECKING:
    from shardsmith.kit.pipeline import EpochIterator, MendedSamples


class Dataset:
    """Base class of loader datasets (see the module): subclasses give ``__len__``, ``read`` and ``kind``."""

    prefetch: ClassVar[Callable[[np.ndarray], None] | None] = None
    release: ClassVar[Callable[[], None] | None] = None
    # checks the samples at the indices against the hash its writer recorded for each, raising
    # DatasetError for one that differs (``verify="sample"``); None: the format records no such hash
    # (every built-in one: their manifests hash whole files, which ``shardsmith verify`` checks)
    verify_samples: ClassVar[Callable[[np.ndarray], None] | None] = None
    samples_mended: ClassVar[Callable[..., MendedSamples] | None] = None
    fingerprint: str | None = None

    @property
    def kind(self) -> SampleKind:
        raise NotImplementedError(f"{type(self).__name__} names no kind of sample")

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, indices: Any) -> Any:
        """The samples at ``indices`` (in that order) as one batch of this dataset's kind."""
        raise NotImplementedError

    def get_batch(self, indices: Any) -> Any:
        """``read``: the name the loaders had first."""
        return self.read(indices)

    def __getitem__(self, i: int) -> Any:
        return self.kind.form.item(self.read(np.array([i], dtype=np.int64)), 0)

    def samples(self, indices: np.ndarray) -> Iterator[Any]:
        """The samples at ``indices``, one at a time in order (an iteration without batches)."""
        return map(self.__getitem__, indices.tolist())

    def origin(self, i: int) -> tuple[str, str]:
        """(shard, key) of sample ``i``, as messages and ``report()`` name a sample that cannot be read;
        a format that knows its shards and keys says them (tar: the shard's path, ``__key__``)."""
        return str(getattr(self, "out_dir", type(self).__name__)), f"#{int(i)}"

    def epoch_order(self) -> EpochOrder:
        """The order ``iter`` and the adapters visit an epoch in: a permutation of the samples."""
        return EpochOrder()

    def iter(self, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
             batch_size: int | None = None, drop_last: bool = False,
             start: int | Mapping[str, Any] | None = None, on_error: str = "raise",
             max_skipped: int | float = 0.01, verify: str | None = None) -> EpochIterator:
        """This rank's samples (or, with ``batch_size``, batches) of one epoch, resumable
        (``state_dict`` / ``load_state_dict``; ``start=``: a position or a ``global_position``).
        ``on_error="skip"`` replaces a sample that cannot be read, up to ``max_skipped`` (a count, or
        a fraction of this rank's samples); ``verify="sample"`` checks each sample against the hash
        its writer recorded for it, where the format records one (``kit/skips.py``)."""
        return self.walk(order=self.epoch_order(), shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, batch_size=batch_size, drop_last=drop_last, start=start,
                         on_error=on_error, max_skipped=max_skipped, verify=verify)

    def walk(self, *, order: EpochOrder, **options: Any) -> EpochIterator:
        """``iter`` in ``order``, the one pipeline's iterator (``kit/pipeline.py``)."""
        from shardsmith.kit.pipeline import EpochIterator

        return EpochIterator(self, order=order, **options)
