"""Random access to HDF5 event shards: ``ds[i]`` (one event), ``get_batch`` (sorted contiguous
ranges, then reordered), ``lengths`` (from offsets only), and a resumable, block-shuffled ``iter``.

Uncompressed datasets (contiguous, see ``shardsmith.formats.hdf5.writer``) are memory-mapped, so a batch
is a numpy gather; compressed ones are read through h5py, one selection per field and shard.
Files open lazily in each process (a forked DataLoader worker opens its own) and are checked on
first open: schema, shapes, dtypes, offsets (start 0, monotonic, end = len(values)), and no
external links, external storage or virtual datasets, so nothing outside the folder is read.
The parts live beside it: ``shard`` (one open shard), ``checks`` (what a shard must be), ``batch``
(``EventBatch`` and ragged joining) and ``order`` (``event_order`` and its iterator).
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema
from shardsmith.core.provenance import inputs_of
from shardsmith.core.ragged import starts_of, take_ragged
from shardsmith.errors import DatasetError
from shardsmith.formats.hdf5.checks import _check_schema
from shardsmith.formats.hdf5.shard import FORMAT, FORMAT_VERSION, _OpenShard
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.dataset_files import files_for
from shardsmith.kit.event_batch import EventBatch, Member, Ragged, _join, _join_runs, _long_runs
from shardsmith.kit.event_order import event_order
from shardsmith.kit.order import window_of
from shardsmith.kit.pipeline import EpochIterator
from shardsmith.kit.rank_split import EpochOrder
from shardsmith.kit.sample_kind import EventForm, SampleKind

__all__ = ["FORMAT", "FORMAT_VERSION", "EventBatch", "EventDataset", "Ragged", "event_order"]

BLOCK = 256  # events a block of the epoch's order holds by default (contiguous reads)


def block_order(block: int, exact: bool) -> EpochOrder:
    """An events epoch's order: shuffled blocks of ``block`` contiguous events, or (``exact``) a
    per-event permutation."""
    if block < 1:
        raise ValueError(f"block={block}: must be at least 1")
    return EpochOrder(None if exact else block)


class EventDataset(Dataset):
    """One split of an hdf5 event dataset: ``len``, ``ds[i] -> dict``, ``get_batch``, ``lengths``, ``iter``."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train",
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None) -> None:
        """``out_dir``: a dataset folder, or a URL read through a local cache in ``cache_dir`` of at
        most ``cache_limit`` bytes (``shardsmith.loader.open``): shards are downloaded whole."""
        self._files = files_for(out_dir, cache_dir=cache_dir, cache_limit=cache_limit)
        self.out_dir = self._files.root
        self.manifest, entries = self._files.load_split(fmt="hdf5", split=split)
        self.split = split
        self._schema_json = self.manifest["schema"]
        # with --provenance: the input names the ``_file`` field indexes (``_entry``: where in that file)
        self.inputs: list[str] | None = inputs_of(self.manifest)
        try:
            self.schema = EventSchema.from_json(self._schema_json)
            _check_schema(self.schema)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"{out_dir}: the manifest's schema is not an event schema ({exc})") from None
        # the schema's field lists, looked up once (its properties build tuples on every call)
        self._fixed_names = tuple(f.name for f in self.schema.fixed)
        self._groups = tuple((c, tuple(f.name for f in self.schema.members(c))) for c in self.schema.counters)
        self._members = {c: tuple(Member.of(f) for f in self.schema.members(c)) for c in self.schema.counters}
        self._paths = self._files.names  # with what the lazily opened shards must still be (``files``)
        self._samples = [e["samples"] for e in entries]
        self._starts = [0]
        for n in self._samples:
            self._starts.append(self._starts[-1] + n)
        self._n = self._starts[-1]
        # random batches map whole shards at once (``_OpenShard.populate``) while the dataset is
        # small next to the machine's memory; a larger one is left to fault in page by page
        # rather than read whole shards from the disk for a few events each
        self._populate = sum(e["bytes"] for e in entries) <= _memory_bytes() // 2
        self._open: list[_OpenShard | None] = [None] * len(self._paths)
        self._offsets: list[dict[str, np.ndarray] | None] = [None] * len(self._paths)  # validated, kept
        self._pins: dict[int, int] = {}  # streamed shards open: the cache's descriptor that holds each
        self._using: list[int] = []  # the shards the current read needs
        self._pid = os.getpid()

    # -- metadata -------------------------------------------------------------------------------

    def origin(self, i: int) -> tuple[str, str]:
        """(shard, ``event j``: its number in the shard) of event ``i``, as a skip names it."""
        s = bisect_right(self._starts, int(i)) - 1
        return str(self._paths[s]), f"event {int(i) - self._starts[s]}"

    def __len__(self) -> int:
        return self._n

    @property
    def shard_paths(self) -> list[Path]:
        return list(self._paths)

    def __getstate__(self) -> dict[str, Any]:
        # open files and maps do not pickle; a spawned worker opens its own
        return {**self.__dict__, "_open": [None] * len(self._paths), "_offsets": [None] * len(self._paths),
                "_pins": {}, "_pid": -1}

    def _shard(self, s: int) -> _OpenShard:
        """Shard s, opened (and checked) on first use in this process, and looked at again before
        each read (``_OpenShard.check``)."""
        if self._pid != os.getpid():  # a forked child: the parent's handles are not ours to use
            self._open = [None] * len(self._paths)
            for fd in self._pins.values():
                os.close(fd)  # our copy only: the parent's hold on its cached files stays
            self._pins = {}
            self._pid = os.getpid()
        shard = self._open[s]
        if shard is None:
            path, want, pin = self._files.local(s, release=lambda: self._trim(self._using, keep=0))
            try:
                shard = _OpenShard(path, samples=self._samples[s], schema=self.schema,
                                   schema_json=self._schema_json, offsets=self._offsets[s], stamp=want)
            except BaseException:
                if pin is not None:
                    os.close(pin)
                raise
            self._offsets[s] = shard.offsets
            self._open[s] = shard
            if pin is not None:
                self._pins[s] = pin
        else:
            shard.check()  # every read comes here first: a file truncated under its map is an error, not SIGBUS
        return shard

    def _trim(self, using: list[int], keep: int | None = None) -> None:
        """A streamed dataset keeps a few shards open: the oldest not in ``using`` (the shards being
        read) are closed, so the cache may evict them (``keep=0``: all of them)."""
        self._using = using
        keep = self._files.keep_open if keep is None else keep
        if keep is None or len(self._pins) <= keep:
            return
        for s in [k for k in self._pins if k not in using][:len(self._pins) - keep]:
            self._release(s)

    def _release(self, s: int) -> None:
        shard = self._open[s]
        if shard is not None:
            shard.close()
            self._open[s] = None
        if s in self._pins:
            os.close(self._pins.pop(s))

    def close(self) -> None:
        for s in range(len(self._open)):
            self._release(s)

    def release(self) -> None:
        """A streamed dataset closes every shard now (they open again when read), so its cache may
        evict them; a local one keeps them open (nothing to evict: ``close`` closes them)."""
        if self._files.streamed:
            self.close()

    def prefetch(self, indices: Any) -> None:
        """The events this process reads next, in order: a streamed dataset downloads their shards
        a few ahead, within its cache's limit (a local one has nothing to do)."""
        self._files.plan(np.searchsorted(np.asarray(self._starts, np.int64), np.asarray(indices, np.int64),
                                         side="right") - 1, release=self.release)

    # -- access ---------------------------------------------------------------------------------

    def _check(self, indices: Any) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._n
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"event index out of range for {n} events")
        return np.where(idx < 0, idx + n, idx)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        """Event i: fixed fields with their shape, ragged fields as that event's values."""
        i = int(i)
        if not -self._n <= i < self._n:
            raise IndexError(f"event index {i} out of range for {self._n} events")
        i %= self._n
        s = bisect_right(self._starts, i) - 1
        self._trim([s])
        shard = self._shard(s)
        self._files.touched(s)
        j = i - self._starts[s]
        out = {}
        for f in self.schema.fields:
            if f.ragged:
                off = shard.offsets[f.counter]
                out[f.name] = shard.columns[f.name].rows(int(off[j]), int(off[j + 1]))
            else:
                out[f.name] = shard.columns[f.name].rows(j, j + 1).reshape(f.shape)
        return out

    @property
    def kind(self) -> SampleKind:
        return SampleKind("events", EventForm(), (("schema", json.dumps(self.schema.to_json(), sort_keys=True)),))

    def __getitems__(self, indices: Sequence[int]) -> EventBatch:
        return self.read(indices)

    def read(self, indices: Any) -> EventBatch:
        """Events ``indices`` (any order, repeats allowed) as one ``EventBatch``.

        Indices that form few contiguous runs (a block of an epoch) are read run by run, one
        slice (or one h5py selection of all runs) per field and shard, then put back in the
        requested order. Scattered indices into memory-mapped (uncompressed) shards are
        gathered directly, one take per field and shard.
        """
        idx = self._check(indices)
        if (window := window_of(idx)) is not None:
            a, n = window.start, window.stop - window.start
            s = bisect_right(self._starts, a) - 1
            if window.stop <= self._starts[s + 1]:
                return self._window(s, a - self._starts[s], n)
        starts = np.asarray(self._starts, dtype=np.int64)
        shard_of = np.searchsorted(starts, idx, side="right") - 1
        touched, counts = np.unique(shard_of, return_counts=True)
        touched = touched.tolist()
        self._trim(touched)
        shards = {s: self._shard(s) for s in touched}
        for s, n in zip(touched, counts.tolist()):
            self._files.touched(s, n)
        runs = 1 + int(np.count_nonzero(np.diff(np.sort(idx)) != 1))
        if runs * 16 > len(idx) and all(shards[s].mapped for s in touched):
            return self._gather_mapped(idx, idx - starts[shard_of], shard_of, shards)
        return self._read_runs(idx)

    def _window(self, s: int, a: int, n: int) -> EventBatch:
        """Events a..a+n-1 of shard s (a window, or a block of an epoch): one slice per field."""
        self._trim([s])
        shard = self._shard(s)
        self._files.touched(s, n)
        b = a + n
        columns = shard.columns
        fixed = {name: columns[name].rows(a, b) for name in self._fixed_names}
        ragged: dict[str, Ragged] = {}
        for c, members in self._groups:
            off = shard.offsets[c]
            va, vb = int(off[a]), int(off[b])
            offsets = off[a:b + 1] - va
            for name in members:
                ragged[name] = Ragged(columns[name].rows(va, vb), offsets)
        return EventBatch(schema=self.schema, fixed=fixed, ragged=ragged, n=n)

    def _gather_mapped(self, idx: np.ndarray, local: np.ndarray, shard_of: np.ndarray,
                       shards: dict[int, _OpenShard]) -> EventBatch:
        """Straight into the requested order from memory-mapped shards, one take (or, for long
        events, one slice per event) per field and shard."""
        schema = self.schema
        if self._populate:
            for shard in shards.values():
                if not shard.populated:
                    shard.populate()
        # each shard's events (where they go in the batch, and their place in the shard), found once;
        # every field then costs O(its values)
        groups: list[tuple[_OpenShard, Any, np.ndarray]] = []
        if len(shards) == 1:
            groups = [(next(iter(shards.values())), slice(None), local)]
        elif shards:
            by_shard = np.argsort(shard_of, kind="stable")
            ordered = shard_of[by_shard]
            bounds = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(idx)]
            groups = []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                ks = by_shard[lo:hi]
                groups.append((shards[int(ordered[lo])], ks, local[ks]))
        fixed = {}
        for f in schema.fixed:
            if len(groups) == 1:
                fixed[f.name] = groups[0][0].columns[f.name].array[local]
                continue
            out = np.empty((len(idx), *f.shape), dtype=f.np_dtype)
            for shard, ks, loc in groups:
                out[ks] = shard.columns[f.name].array[loc]
            fixed[f.name] = out
        ragged: dict[str, Ragged] = {}
        for c in schema.counters:
            first = np.empty(len(idx), dtype=np.int64)
            counts = np.empty(len(idx), dtype=np.int64)
            for shard, ks, loc in groups:
                off = shard.offsets[c]
                first[ks] = off[loc]
                counts[ks] = off[loc + 1] - first[ks]
            offsets = starts_of(counts)
            members = schema.members(c)
            layout = self._members[c]
            if int(offsets[-1]) and _long_runs(counts, min(f.item_bytes for f in layout)):
                for name, values in _join_runs(layout, shards, shard_of, first, counts).items():
                    ragged[name] = Ragged(values, offsets)
                continue
            plans = []  # per shard: (where its values come from, where they go; None = everywhere, in order)
            for shard, ks, _ in groups:
                n_k = counts[ks]
                inner = starts_of(n_k)
                step = np.arange(int(inner[-1]), dtype=np.int64) - np.repeat(inner[:-1], n_k)
                src = np.repeat(first[ks], n_k) + step
                dst = None if len(groups) == 1 else np.repeat(offsets[:-1][ks], n_k) + step
                plans.append((shard, src, dst))
            for f in members:
                if len(groups) == 1:
                    shard, src, _ = plans[0]
                    values = shard.columns[f.name].array[src]
                else:
                    values = np.empty((int(offsets[-1]), *f.shape), dtype=f.np_dtype)
                    for shard, src, dst in plans:
                        values[dst] = shard.columns[f.name].array[src]
                ragged[f.name] = Ragged(values, offsets)
        return EventBatch(schema=schema, fixed=fixed, ragged=ragged, n=len(idx))

    def _read_runs(self, idx: np.ndarray) -> EventBatch:
        """Sorted distinct indices in contiguous runs, read with one slice or h5py selection per run
        set, field and shard, then put back in the requested order."""
        ordered = bool(np.all(idx[1:] > idx[:-1]))
        uniq, inverse = (idx, None) if ordered else np.unique(idx, return_inverse=True)
        starts = np.asarray(self._starts, dtype=np.int64)
        shard_of = np.searchsorted(starts, uniq, side="right") - 1
        cut = np.flatnonzero((np.diff(uniq) != 1) | (np.diff(shard_of) != 0)) + 1
        run_a = uniq[np.concatenate([[0], cut])] if len(uniq) else uniq
        run_b = uniq[np.concatenate([cut - 1, [len(uniq) - 1]])] + 1 if len(uniq) else uniq
        run_shard = shard_of[np.concatenate([[0], cut])] if len(uniq) else uniq
        fixed_parts: dict[str, list[np.ndarray]] = {f.name: [] for f in self.schema.fixed}
        value_parts: dict[str, list[np.ndarray]] = {f.name: [] for f in self.schema.ragged}
        count_parts: dict[str, list[np.ndarray]] = {c: [] for c in self.schema.counters}
        for s in np.unique(run_shard).tolist():
            shard = self._shard(s)
            mine = run_shard == s
            a, b = run_a[mine] - starts[s], run_b[mine] - starts[s]
            for f in self.schema.fixed:
                fixed_parts[f.name].append(shard.columns[f.name].ranges(a, b))
            local = uniq[shard_of == s] - starts[s]
            for c in self.schema.counters:
                off = shard.offsets[c]
                count_parts[c].append(off[local + 1] - off[local])
                va, vb = off[a], off[b]
                for f in self.schema.members(c):
                    value_parts[f.name].append(shard.columns[f.name].ranges(va, vb))
        fixed = {name: _join(parts, (0, *self.schema[name].shape), self.schema[name].np_dtype)
                 for name, parts in fixed_parts.items()}
        if inverse is not None:
            fixed = {name: col[inverse] for name, col in fixed.items()}
        ragged: dict[str, Ragged] = {}
        for c in self.schema.counters:
            counts = np.concatenate(count_parts[c]) if count_parts[c] else np.zeros(0, np.int64)
            offsets = starts_of(counts if inverse is None else counts[inverse])
            for f in self.schema.members(c):
                values = _join(value_parts[f.name], (0, *f.shape), f.np_dtype)
                if inverse is not None:
                    values = take_ragged(values, counts, inverse)
                ragged[f.name] = Ragged(values, offsets)
        return EventBatch(schema=self.schema, fixed=fixed, ragged=ragged, n=len(idx))

    def lengths(self, counter: str) -> np.ndarray:
        """Every event's length in ``counter`` (int64), from the offsets alone: for length bucketing."""
        if counter not in self.schema.counters:
            raise KeyError(f"no counter {counter!r} (counters: {', '.join(self.schema.counters)})")
        parts = []
        for s in range(len(self._paths)):
            self._trim([s])
            parts.append(np.diff(self._shard(s).offsets[counter]))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def labels(self, field: str = "label") -> np.ndarray:
        """Every event's integer label: the fixed scalar field ``field``, read column by column."""
        spec = next((f for f in self.schema.fixed if f.name == field), None)
        if spec is None or spec.shape or spec.np_dtype.kind not in "iu":
            raise DatasetError(f"{self.out_dir}: labels need a fixed integer scalar field; {field!r} is not one "
                               f"(fields: {', '.join(f.name for f in self.schema.fixed)})")
        parts = [self._shard(s).columns[field].rows(0, n).reshape(-1) for s, n in enumerate(self._samples)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    get_batch = read

    def epoch_order(self) -> EpochOrder:
        return block_order(BLOCK, False)

    def iter(self, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
             batch_size: int | None = None, block: int = BLOCK, exact: bool = False, drop_last: bool = False,
             start: int | Mapping[str, Any] | None = None, **checks: Any) -> EpochIterator:
        """This rank's events (or ``EventBatch``es) of one epoch, on the loader's pipeline.

        By default contiguous blocks of ``block`` events are visited in a shuffled order (the
        order inside a block is kept, so reads stay contiguous); ``exact=True`` shuffles every
        event. Ranks take runs of ``batch_size`` events of that order in turn (single events: a
        stride), every rank as many; ``state_dict()`` / ``load_state_dict()`` resume exactly;
        ``checks``: ``on_error``, ``max_skipped``, ``verify`` (``Dataset.iter``)."""
        return self.walk(order=block_order(block, exact), shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                         world_size=world_size, batch_size=batch_size, drop_last=drop_last, start=start, **checks)


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
