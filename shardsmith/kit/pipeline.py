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
4. skip policy (``kit/skips.py``): ``Fetch`` is the one place that reads; a sample that cannot be
   read is one line naming its shard and key, or (``on_error="skip"``) is replaced by its substitute,
   counted against ``max_skipped`` and recorded in the state's ``skipped`` list;
5. collate: ``collate(batch)`` (an adapter's tensors, a user's function), in the stream's process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from itertools import chain
from typing import Any, Protocol

import numpy as np

from shardsmith.errors import DatasetError
from shardsmith.kit.epoch import EpochStream
from shardsmith.kit.rank_split import EpochOrder
from shardsmith.kit.skips import (
    TRIES,
    SkipPolicy,
    SkipReport,
    check_entries,
    fault,
    origin,
    reason_of,
    substitutes,
)


class MendedSamples(Protocol):
    """What ``samples_mended`` returns: an iterator of samples, and how many it has handed over."""

    position: int

    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...


class Fetch:
    """The pipeline's reads of ``dataset``, and its skip policy (``kit/skips.py``): the one place that
    reads. ``batch`` and ``sample`` read; a read that fails (``DatasetError``) goes to ``mend``, which
    raises one line naming the shard and key, or (``on_error="skip"``) replaces the samples that do
    not read by their substitutes, records each in ``skipped`` and checks the limit. ``part`` tells
    it the epoch being walked and this stream's share of it (the substitutes' key, the limit's base)."""

    def __init__(self, dataset: Any, policy: SkipPolicy, *, seed: int) -> None:
        self.dataset = dataset
        self.policy = policy
        self.seed = seed
        self.n = len(dataset)
        self.skipped: list[dict[str, Any]] = []
        self.epoch = 0
        self._steps: tuple[Any, range] | None = None  # (layout, this stream's steps) of the part walked
        check = getattr(dataset, "verify_samples", None)
        if policy.verify is not None and check is None:
            raise ValueError(f"verify='sample': {type(dataset).__name__} records no hash per sample to check "
                             f"against (shardsmith's formats hash whole files: shardsmith verify checks them)")
        self.verify: Callable[[np.ndarray], None] | None = check if policy.verify is not None else None

    def part(self, *, epoch: int, layout: Any, steps: range) -> None:
        """The iteration enters (a part of) epoch ``epoch``, where this stream takes ``steps`` of
        ``layout`` (an ``EpochLayout``): records of other epochs are let go."""
        if epoch != self.epoch:
            self.skipped = [e for e in self.skipped if e["epoch"] == epoch]
        self.epoch, self._steps = epoch, (layout, steps)

    def share(self) -> int:
        """The samples this stream reads in the epoch walked (what a fraction ``max_skipped`` is of)."""
        if self._steps is None:
            return 0
        layout, steps = self._steps
        return len(layout.positions_of(steps))

    def batch(self, indices: np.ndarray) -> Any:
        try:
            batch = self.dataset.read(indices)
            if self.verify is not None:
                self.verify(indices)
            return batch
        except DatasetError as error:
            return self.dataset.read(self.mend(indices, error))

    def samples(self, indices: np.ndarray) -> Iterator[Any]:
        """The samples at ``indices`` one at a time, each verified first when ``verify`` is set."""
        items = self.dataset.samples(indices)
        return items if self.verify is None else _verified(items, indices, self.verify)

    def sample(self, index: int, error: DatasetError) -> Any:
        """The sample that stands in for ``index``, whose read raised ``error`` (or that error, raised)."""
        (substitute,) = self.mend(np.array([index], dtype=np.int64), error)
        return next(iter(self.dataset.samples(np.array([substitute], dtype=np.int64))))

    def readable(self, index: int) -> DatasetError | None:
        """None if sample ``index`` reads (and verifies), else the error its read raised."""
        one = np.array([index], dtype=np.int64)
        try:
            self.dataset.read(one)
            if self.verify is not None:
                self.verify(one)
        except DatasetError as error:
            return error
        return None

    def mend(self, indices: np.ndarray, error: DatasetError) -> np.ndarray:
        """``indices`` with each sample that does not read replaced by its first readable substitute,
        each recorded; raises when the policy is to raise, past the limit, or when every sample reads
        alone (the batch's error is then not one sample's: raised as it is)."""
        out = np.array(indices, dtype=np.int64, copy=True)
        bad = [(k, found) for k, i in enumerate(out.tolist()) for found in [self.readable(i)] if found is not None]
        if not bad:
            raise error
        for k, found in bad:
            index = int(out[k])
            shard, key = origin(self.dataset, index)
            reason = reason_of(found, shard)
            if self.policy.on_error == "raise":
                raise fault(shard, key, reason, after=" (on_error='skip' replaces such samples)")
            mine = sum(e["epoch"] == self.epoch for e in self.skipped)
            allowed = self.policy.limit(self.share())
            if mine >= allowed:
                raise fault(shard, key, reason, after=f" (one more skip than the {allowed} that "
                            f"{self.policy.shown()} allows this stream)")
            substitute = next((c for c in substitutes(self.n, seed=self.seed, epoch=self.epoch, index=index)
                               if self.readable(c) is None), None)
            if substitute is None:
                raise fault(shard, key, reason, after=f" (and none of its {TRIES} substitutes reads)")
            self.skipped.append({"epoch": self.epoch, "index": index, "substitute": substitute, "shard": shard,
                                 "key": key, "reason": reason})
            out[k] = substitute
        return out


def _verified(items: Iterator[Any], indices: np.ndarray, verify: Callable[[np.ndarray], None]) -> Iterator[Any]:
    """``items`` (the samples at ``indices``), each handed over once ``verify`` has checked it."""
    for k, item in enumerate(items):
        verify(indices[k:k + 1])
        yield item


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
    ``on_error``, ``max_skipped``, ``verify``: the skip policy (``kit/skips.py``).
    """

    def __init__(self, dataset: Any, *, order: EpochOrder, batch_size: int | None, shuffle: bool, seed: int,
                 epoch: int, rank: int | None, world_size: int | None, start: int | Mapping[str, Any] | None,
                 drop_last: bool, collate: Callable[[Any], Any] | None = None, on_error: str = "raise",
                 max_skipped: int | float = 0.01, verify: str | None = None) -> None:
        self.dataset = dataset
        self.collate = collate
        self.fetch = Fetch(dataset, SkipPolicy(on_error=on_error, max_skipped=max_skipped, verify=verify), seed=seed)
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
        walk = self.dataset.samples_mended
        if self.batch_size is None and walk is not None and self.fetch.verify is None:
            items = chain.from_iterable(self._walks(parts, walk))
            return items if self.collate is None else map(self.collate, items)
        return self._items(parts)

    @property
    def _produced(self) -> int:
        """Items handed over in the running iteration: those counted here, plus those of the
        dataset's own walk of the part being read (``samples_mended``), which counts its own."""
        live = self._live
        return self._base if live is None else self._base + live.position

    @_produced.setter
    def _produced(self, value: int) -> None:
        self._base, self._live = value, None

    def _walks(self, parts: list[Any], walk: Callable[..., MendedSamples]) -> Iterator[MendedSamples]:
        """Single samples, each part's by the dataset's own walk (``samples_mended``: no frame here per
        sample); a sample that does not read is mended in place by the skip policy (``Fetch.sample``)."""
        for k, (order, layout, steps) in enumerate(parts):
            if k:
                self._enter(k)
            self._live = live = walk(order[layout.positions_of(steps)], mend=self.fetch.sample)
            yield live
            self._produced = self._produced  # the part's count, kept once its walk is let go
        self._release()

    def _enter(self, k: int) -> None:
        """Part k starts: the skip policy learns its epoch and this stream's steps of it (the base of a
        fractional ``max_skipped``, counted only once a sample is skipped)."""
        super()._enter(k)
        place = self._places[k]
        layout = self.layout(start=place["start"])
        worker, workers = self._stream()
        self.fetch.part(epoch=place["epoch"], layout=layout,
                        steps=range((worker - place["shift"]) % workers, layout.steps, workers))

    def _items(self, parts: list[Any]) -> Iterator[Any]:
        """Each part's items, fetched and collated; the count goes up before each is handed over (a
        state taken while the consumer holds item k counts k + 1)."""
        collate = self.collate
        fetch = self.fetch
        for k, (order, layout, steps) in enumerate(parts):
            if k:
                self._enter(k)
            if self.batch_size is not None:
                for items in (fetch.batch(order[layout.positions(step)]) for step in steps):
                    self._produced += 1
                    yield items if collate is None else collate(items)
                continue
            # single samples: one pass over the part, read ahead by the dataset; a sample that does not
            # read ends that pass (a generator that raised is done): it is mended, and a new pass goes on
            # (the loop per sample is this count and the yield: ``done`` is counted from it)
            positions = order[layout.positions_of(steps)]
            done = 0
            while done < len(positions):
                first = self._produced - done  # the count before the part's first sample
                try:
                    for item in fetch.samples(positions[done:]):
                        self._produced += 1
                        yield item if collate is None else collate(item)
                    done = self._produced - first
                except DatasetError as error:
                    done = self._produced - first
                    item = fetch.sample(int(positions[done]), error)
                    done += 1
                    self._produced += 1
                    yield item if collate is None else collate(item)
        self._release()

    def _release(self) -> None:
        """The iteration is over: the dataset lets go of what it holds open (``Dataset.release``)."""
        release = self.dataset.release
        if release is not None:
            release()

    def _skip_records(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.fetch.skipped]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.fetch.skipped = check_entries(state.get("skipped", []))

    def report(self) -> SkipReport:
        """What this stream skipped in the epoch it walks (shard, key, reason, and where). A
        DataLoader's workers keep their own: ``skip_report(loader.state_dict())``."""
        return SkipReport(tuple(self._skip_records()))


class EpochIterator:
    """``ds.iter(...)``: an ``EpochPipeline`` in this process (one stream) as an iterator. ``next``
    starts the iteration (from a loaded state, if any) and goes on with it; ``load_state_dict`` and
    ``set_epoch`` make the next ``next`` start anew; once the epoch is over it stays over. ``len()``:
    the epoch's items for this rank from its start (a loaded state: what is left).

    It holds the pipeline and its running iteration, and neither holds it: an iterator dropped
    mid-epoch frees its dataset's open files at once, not at the next garbage collection."""

    def __init__(self, dataset: Any, *, order: EpochOrder, batch_size: int | None, shuffle: bool, seed: int,
                 epoch: int, rank: int, world_size: int, start: int | Mapping[str, Any] | None = None,
                 drop_last: bool = False, collate: Callable[[Any], Any] | None = None, on_error: str = "raise",
                 max_skipped: int | float = 0.01, verify: str | None = None) -> None:
        self.pipeline = EpochPipeline(dataset, order=order, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                      epoch=epoch, rank=rank, world_size=world_size, start=start,
                                      drop_last=drop_last, collate=collate, on_error=on_error,
                                      max_skipped=max_skipped, verify=verify)
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

    def report(self) -> SkipReport:
        """What this iteration skipped in its epoch (``on_error="skip"``): shard, key, reason of each."""
        return self.pipeline.report()
