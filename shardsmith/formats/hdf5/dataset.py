"""Random access to HDF5 event shards: ``ds[i]`` (one event), ``get_batch`` (sorted contiguous
ranges, then reordered), ``lengths`` (from offsets only), and a resumable, block-shuffled ``iter``.

Uncompressed datasets (contiguous, see ``shardsmith.formats.hdf5.writer``) are memory-mapped, so a batch
is a numpy gather; compressed ones are read through h5py, one selection per field and shard.
Files open lazily in each process (a forked DataLoader worker opens its own) and are checked on
first open: schema, shapes, dtypes, offsets (start 0, monotonic, end = len(values)), and no
external links, external storage or virtual datasets, so nothing outside the folder is read.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.events import EventChunk, EventSchema, Field
from shardsmith.core.identity import Stamp, check_fd, open_checked, stamp
from shardsmith.core.memory import no_gc
from shardsmith.core.ragged import RUN_BYTES, join, slices, starts_of, take_ragged
from shardsmith.engine.keys import path_hash
from shardsmith.errors import DatasetError
from shardsmith.formats.order import ResumableIterator, epoch_order

FORMAT = "shardsmith-events"  # the writer's root attribute (kept in sync with shardsmith.formats.hdf5.writer)
FORMAT_VERSION = 1


# -- batches ------------------------------------------------------------------------------------

@dataclass(slots=True)
class Ragged:
    """One ragged field of a batch: event k is ``values[offsets[k]:offsets[k + 1]]``.

    Fields of one counter share the same ``offsets`` array object.
    """

    values: np.ndarray
    offsets: np.ndarray  # int64, (B + 1,), starting at 0

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, k: int) -> np.ndarray:
        return self.values[self.offsets[k]:self.offsets[k + 1]]


@dataclass(slots=True)
class EventBatch:
    """B events as columns: ``fixed[name]`` is (B, *shape); ``ragged[name]`` is a ``Ragged``."""

    schema: EventSchema
    fixed: dict[str, np.ndarray]
    ragged: dict[str, Ragged]
    n: int

    def __len__(self) -> int:
        return self.n

    def offsets(self, counter: str) -> np.ndarray:
        """The counter's offsets (B + 1), shared by its member fields."""
        return self.ragged[self.schema.members(counter)[0].name].offsets

    def lengths(self, counter: str) -> np.ndarray:
        return np.diff(self.offsets(counter))

    def event(self, k: int) -> dict[str, np.ndarray]:
        """Event k as ``ds[i]`` returns it."""
        out = {name: np.asarray(col[k]) for name, col in self.fixed.items()}
        out.update({name: r[k] for name, r in self.ragged.items()})
        return {f.name: out[f.name] for f in self.schema.fields}

    def to_chunk(self) -> EventChunk:
        columns = {**self.fixed, **{name: r.values for name, r in self.ragged.items()}}
        return EventChunk(first=0, n=self.n, columns=columns,
                          offsets={c: self.offsets(c) for c in self.schema.counters})

    @classmethod
    def from_samples(cls, samples: Sequence[dict[str, np.ndarray]], schema: EventSchema) -> EventBatch:
        """Events as ``ds[i]`` returns them, stacked (one concatenation per field)."""
        fixed = {f.name: np.stack([np.asarray(s[f.name], dtype=f.np_dtype) for s in samples]).reshape(
            len(samples), *f.shape) for f in schema.fixed}
        ragged: dict[str, Ragged] = {}
        for c in schema.counters:
            members = schema.members(c)
            offsets = starts_of(np.array([len(s[members[0].name]) for s in samples], dtype=np.int64))
            for f in members:
                parts = [np.asarray(s[f.name], dtype=f.np_dtype).reshape(-1, *f.shape) for s in samples]
                values = np.concatenate(parts) if parts else np.zeros((0, *f.shape), f.np_dtype)
                if len(values) != offsets[-1]:
                    raise ValueError(f"field {f.name!r}: lengths differ from the other fields of counter {c!r}")
                ragged[f.name] = Ragged(values, offsets)
        return cls(schema=schema, fixed=fixed, ragged=ragged, n=len(samples))


# -- epoch orders -------------------------------------------------------------------------------

def event_order(n: int, *, shuffle: bool, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
                block: int = 256, exact: bool = False) -> np.ndarray:
    """This rank's event indices for one epoch, in visiting order.

    ``exact``: a full per-event permutation, dealt to ranks by stride (as ``epoch_order``).
    Otherwise contiguous blocks of ``block`` events in a permuted order (``shuffle``) or in file
    order, and each rank takes one contiguous stretch of that sequence, so reads stay
    contiguous. Every rank gets ``n // world_size`` events: the last ``n % world_size`` of the
    sequence are dropped (different ones each epoch when shuffled).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
    if block < 1:
        raise ValueError(f"block={block}: must be at least 1")
    if exact and shuffle:
        return epoch_order(n, shuffle=True, seed=seed, epoch=epoch, rank=rank, world_size=world_size)
    if shuffle and n > block:
        # Rotate by a per-epoch offset, then permute the whole blocks and keep the one short block
        # last: batches of ``block`` events stay one contiguous read each (one wraps around the end),
        # and the remainder dropped for the ranks is a different stretch each epoch.
        rotate = int(path_hash(f"blocks:{seed}", str(epoch)) % np.uint64(n))
        full = n // block
        blocks = epoch_order(full, shuffle=True, seed=seed, epoch=epoch)
        order = (np.repeat(blocks * block, block) + np.tile(np.arange(block, dtype=np.int64), full))
        order = np.concatenate([order, np.arange(full * block, n, dtype=np.int64)])
        order = (order + rotate) % n
    else:
        order = np.arange(n, dtype=np.int64)
    share = n // world_size
    return order[rank * share:(rank + 1) * share]


class EventIterator(ResumableIterator[Any]):
    """``ResumableIterator`` over an ``event_order`` (block or exact shuffle); same state_dict rules."""

    def __init__(self, *, n: int, order: np.ndarray, get_item: Callable[[int], Any],
                 get_batch: Callable[[np.ndarray], Any], config: dict[str, Any]) -> None:
        # The base class builds an epoch_order; ours is given, so set its fields directly.
        self._n = n
        self._get_item = get_item
        self._get_batch = get_batch
        self._config = config
        self._order = order
        self.position = 0


# -- one shard ----------------------------------------------------------------------------------

def _bad(path: Path, msg: str) -> DatasetError:
    return DatasetError(f"{path}: {msg}")


def _check_schema(schema: EventSchema) -> None:
    """What ``EventSchema.from_json`` takes on trust: names and counters are strings, shapes are
    tuples of small non-negative ints (ValueError otherwise)."""
    for f in schema.fields:
        if not isinstance(f.dtype, str) or not (f.counter is None or (isinstance(f.counter, str) and f.counter)):
            raise ValueError(f"field {f.name!r}: dtype {f.dtype!r} or counter {f.counter!r} is not a name")
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 31 for d in f.shape):
            raise ValueError(f"field {f.name!r}: shape {list(f.shape)!r} is not a list of sizes")


def _equals(value: Any, expected: str | int) -> bool:
    """An HDF5 attribute equals a scalar: an array, or a value of another type, never does."""
    if isinstance(value, np.ndarray) and value.ndim:
        return False
    if isinstance(expected, str):
        return isinstance(value, str) and value == expected
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) == expected


def _dataset(f: Any, name: str, path: Path) -> Any:
    """A dataset reached by hard links only, with its data inside this file."""
    import h5py

    node = f
    parts = name.split("/")
    for depth, part in enumerate(parts):
        if not isinstance(node, h5py.Group):  # e.g. a fixed field where the schema says ragged
            raise _bad(path, f"{'/'.join(parts[:depth])!r} is not a group (written by another tool, or damaged?)")
        link = node.get(part, getlink=True)
        if link is None:
            raise _bad(path, f"no {'/'.join(parts[:depth + 1])!r} (written by another tool, or damaged?)")
        if not isinstance(link, h5py.HardLink):
            raise _bad(path, f"{'/'.join(parts[:depth + 1])!r} is a {type(link).__name__}; "
                             f"shardsmith reads only objects stored in the file itself")
        node = node[part]
    if not isinstance(node, h5py.Dataset):
        raise _bad(path, f"{name!r} is not a dataset")
    if node.is_virtual or node.id.get_create_plist().get_external_count():
        raise _bad(path, f"{name!r} keeps its data in other files; shardsmith reads only this file")
    return node


def _check_filters(ds: Any, path: Path) -> None:
    """Every compression filter of the dataset is available, loading hdf5plugin (blosc, zstd, …) if needed."""
    from h5py import h5z

    dcpl = ds.id.get_create_plist()
    for k in range(dcpl.get_nfilters()):
        code, _flags, _values, name = dcpl.get_filter(k)
        if h5z.filter_avail(code):
            continue
        with contextlib.suppress(ImportError):
            import hdf5plugin  # noqa: F401  (registers blosc, zstd, lz4, … with HDF5)
        if not h5z.filter_avail(code):
            label = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            raise _bad(path, f"{ds.name!r} is compressed with HDF5 filter {code} ({label}), which is not "
                             f"installed: pip install hdf5plugin")


# How far each filter can expand what is stored: deflate at most 1032:1 (its format's limit), LZF
# about 88:1 (a 264-byte match in 3 bytes); blosc (LZ4 inside, as the writer sets it) measured 236:1
# on all-zero chunks. Any other filter gets the most generous of them.
_MAX_EXPANSION = {"gzip": 1032, "lzf": 100}
_OTHER_FILTERS = 2048


def _check_storage(ds: Any, path: Path, file_size: int) -> None:
    """The dataset's declared size is backed by bytes in the file, checked from metadata alone
    before anything is read or allocated: a 10 KB file that declares 3e8 events (chunks never
    written, or a contiguous dataset never allocated, both read back as fill values) is refused."""
    nbytes = int(ds.size) * ds.dtype.itemsize
    if nbytes == 0:
        return
    if ds.chunks is None:
        offset = ds.id.get_offset()
        if offset is None or offset + nbytes > file_size:
            raise _bad(path, f"{ds.name!r} declares {nbytes} bytes that the {file_size}-byte file does not hold")
        return
    expected = 1
    for size, chunk in zip(ds.shape, ds.chunks):
        expected *= -(-size // chunk)
    stored = ds.id.get_storage_size()
    if ds.id.get_num_chunks() != expected:
        raise _bad(path, f"{ds.name!r} has {ds.id.get_num_chunks()} of its {expected} chunks stored")
    limit = _MAX_EXPANSION.get(ds.compression, _OTHER_FILTERS) if ds.compression or \
        ds.id.get_create_plist().get_nfilters() else 1
    if stored > file_size or nbytes > limit * stored + (1 << 16):
        raise _bad(path, f"{ds.name!r} declares {nbytes} bytes, more than its {stored} stored bytes can hold")


def _h5_ranges(ds: Any, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Rows ``[starts[k], stops[k])`` of an h5py dataset back to back: one read of a union selection."""
    from h5py import h5s

    lens = stops - starts
    inner = tuple(ds.shape[1:])
    out = np.empty((int(lens.sum()), *inner), dtype=ds.dtype)
    if len(out) == 0:
        return out
    space = ds.id.get_space()
    op = h5s.SELECT_SET
    zeros = (0,) * len(inner)
    for a, n in zip(starts[lens > 0].tolist(), lens[lens > 0].tolist()):
        space.select_hyperslab((a, *zeros), (n, *inner), op=op)
        op = h5s.SELECT_OR
    ds.id.read(h5s.create_simple(out.shape), space, out)
    return out


def _np_ranges(arr: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The same for an in-memory (memory-mapped) array: one gather for short ranges, slices for long."""
    lens = stops - starts
    total = int(lens.sum())
    if len(starts) == 1:
        return np.array(arr[int(starts[0]):int(stops[0])])
    if total <= 64 * len(starts):
        index = np.repeat(starts - starts_of(lens)[:-1], lens) + np.arange(total, dtype=np.int64)
        return arr[index]
    parts = [arr[a:b] for a, b in zip(starts.tolist(), stops.tolist())]
    return np.concatenate(parts) if parts else arr[:0].copy()


class _Column:
    """One dataset of an open shard: a memory-mapped array, or an h5py dataset when compressed."""

    __slots__ = ("array", "ds")

    def __init__(self, array: np.ndarray | None, ds: Any) -> None:
        self.array = array
        self.ds = ds

    def rows(self, a: int, b: int) -> np.ndarray:
        if self.array is not None:
            return np.array(self.array[a:b])
        with self._reading():
            return self.ds[a:b]

    def ranges(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        if self.array is not None:
            return _np_ranges(self.array, starts, stops)
        with self._reading():
            return _h5_ranges(self.ds, starts, stops)

    def full(self) -> np.ndarray:
        if self.array is not None:
            return self.array
        with self._reading():
            return self.ds[...]

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """HDF5's errors (a damaged chunk, a failing filter) as a DatasetError naming the file."""
        try:
            yield
        except OSError as exc:
            raise DatasetError(f"{self.ds.file.filename}: cannot read {self.ds.name!r} ({exc})") from None


class _OpenShard:
    """A checked, open shard: its columns and its (validated) offsets per counter."""

    def __init__(self, path: Path, *, samples: int, schema: EventSchema, schema_json: dict[str, Any],
                 offsets: dict[str, np.ndarray] | None, stamp: Stamp | None = None) -> None:
        import h5py

        self.path = path
        self.stamp = stamp
        try:
            # HDF5's default locking, as plain h5py users open files: the same file opened twice in
            # one process must be opened with the same locking flags
            self.file = h5py.File(path, "r")
        except OSError as exc:
            raise _bad(path, f"cannot open as HDF5 ({exc})") from None
        try:
            check_fd(self.file.id.get_vfd_handle(), path, stamp)
        except BaseException:
            self.file.close()
            raise
        self.mm: mmap.mmap | None = None
        self.populated = False
        self._bytes: dict[str, memoryview] = {}
        try:
            self._check_attrs(samples, schema_json)
            self.columns: dict[str, _Column] = {}
            self.offsets: dict[str, np.ndarray] = {}
            for f in schema.fixed:
                self.columns[f.name] = self._column(f.name, (samples, *f.shape), f.np_dtype)
            for c in schema.counters:
                self._counter(c, schema, samples, None if offsets is None else offsets.get(c))
        except BaseException:
            self.close()
            raise
        self.mapped = all(col.array is not None for col in self.columns.values())
        if self.mapped:
            self.file.close()  # everything is memory-mapped: no HDF5 handle to carry around
            self.file = None
            for col in self.columns.values():
                col.ds = None

    def _check_attrs(self, samples: int, schema_json: dict[str, Any]) -> None:
        attrs = self.file.attrs
        if not _equals(attrs.get("format"), FORMAT) or not _equals(attrs.get("format_version"), FORMAT_VERSION):
            raise _bad(self.path, f"not a shardsmith event shard of format version {FORMAT_VERSION}")
        try:
            file_schema = json.loads(attrs["schema"])
        except (KeyError, TypeError, ValueError):
            raise _bad(self.path, "no readable 'schema' attribute") from None
        if file_schema != schema_json:
            raise _bad(self.path, "its schema attribute differs from the manifest's schema")
        if not _equals(attrs.get("samples"), samples):
            shown = " ".join(str(attrs.get("samples")).split())[:40]  # one line, whatever was stored
            raise _bad(self.path, f"holds {shown} events, the manifest says {samples}")

    def _column(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> _Column:
        ds = _dataset(self.file, name, self.path)
        if ds.shape != shape or ds.dtype != dtype:
            raise _bad(self.path, f"{name!r} is {ds.dtype}{list(ds.shape)}, expected {dtype}{list(shape)}")
        _check_filters(ds, self.path)
        _check_storage(ds, self.path, self.stamp.size if self.stamp is not None else os.path.getsize(self.path))
        return _Column(self._mapped(ds), ds)

    def _mapped(self, ds: Any) -> np.ndarray | None:
        """A read-only view of a contiguous, unfiltered dataset's bytes, or None to read via h5py."""
        if ds.chunks is not None or ds.compression is not None:
            return None
        if ds.size == 0:
            return np.zeros(ds.shape, dtype=ds.dtype)
        offset = ds.id.get_offset()
        if offset is None:  # refused by _check_storage: never read as fill values
            raise _bad(self.path, f"{ds.name!r} has no data stored in the file")
        if self.mm is None:
            with os.fdopen(open_checked(self.path, self.stamp), "rb") as fh:
                self.mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        if offset + ds.nbytes > len(self.mm):
            raise _bad(self.path, f"{ds.name!r} runs past the end of the file (truncated?)")
        return np.frombuffer(self.mm, dtype=ds.dtype, count=ds.size, offset=offset).reshape(ds.shape)

    def bytes_of(self, name: str) -> memoryview:
        """A mapped column's bytes, as one flat memoryview (made once)."""
        view = self._bytes.get(name)
        if view is None:
            array = self.columns[name].array
            assert array is not None
            view = self._bytes[name] = memoryview(array).cast("B") if array.size else memoryview(b"")
        return view

    def populate(self) -> None:
        """Map every page of the shard now (``MADV_POPULATE_READ``), once: a random batch touches a
        new page per event and field, and faulting them in one by one cost 4-6x the copy (35-60k
        events/s against over 200k/s with the pages mapped; 255 MB map in 45-75 ms from the page
        cache). Where the kernel lacks it (before Linux 5.14), pages fault in as before."""
        self.populated = True
        advice = getattr(mmap, "MADV_POPULATE_READ", 22 if os.uname().sysname == "Linux" else None)
        if self.mm is not None and advice is not None:
            with contextlib.suppress(OSError, ValueError):
                self.mm.madvise(advice)

    def _counter(self, c: str, schema: EventSchema, samples: int, known: np.ndarray | None) -> None:
        members = schema.members(c)
        first = _dataset(self.file, f"{members[0].name}/offsets", self.path)
        col = self._column(f"{members[0].name}/offsets", (samples + 1,), np.dtype(np.int64))
        if known is None:
            off = col.full()
            if off[0] != 0 or np.any(off[1:] < off[:-1]):
                raise _bad(self.path, f"offsets of counter {c!r} ({first.name}) do not start at 0 and "
                                      f"never decrease")
        else:
            off = known
        self.offsets[c] = off
        for f in members:
            if f is not members[0]:
                other = _dataset(self.file, f"{f.name}/offsets", self.path)
                # not a hard link to the first member's: its shape and storage are checked like the
                # first's before it is read whole
                if other != first and not np.array_equal(
                        self._column(f"{f.name}/offsets", (samples + 1,), np.dtype(np.int64)).full(), off):
                    raise _bad(self.path, f"{f.name!r} and {members[0].name!r} share counter {c!r} but "
                                          f"their offsets differ")
            values = _dataset(self.file, f"{f.name}/values", self.path)
            if values.shape[:1] != (int(off[-1]),):
                raise _bad(self.path, f"offsets of counter {c!r} end at {int(off[-1])} but {f.name!r} holds "
                                      f"{values.shape[0] if values.shape else 0} values")
            self.columns[f.name] = self._column(f"{f.name}/values", (int(off[-1]), *f.shape), f.np_dtype)

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(Exception):
                self.file.close()
            self.file = None
        self.columns = {}


# -- the dataset --------------------------------------------------------------------------------

class EventDataset:
    """One split of an hdf5 event dataset: ``len``, ``ds[i] -> dict``, ``get_batch``, ``lengths``, ``iter``."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train") -> None:
        self.out_dir = Path(out_dir)
        self.manifest, entries = manifest_mod.load_split(out_dir, fmt="hdf5", split=split)
        self.split = split
        self._schema_json = self.manifest["schema"]
        try:
            self.schema = EventSchema.from_json(self._schema_json)
            _check_schema(self.schema)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"{out_dir}: the manifest's schema is not an event schema ({exc})") from None
        self._paths = [manifest_mod.resolve_inside(out_dir, e["path"]) for e in entries]
        # what the lazily opened shards must still be
        self._stamps = [stamp(path, size=e["bytes"]) for path, e in zip(self._paths, entries)]
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
        self._pid = os.getpid()

    # -- metadata -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    @property
    def shard_paths(self) -> list[Path]:
        return list(self._paths)

    def __getstate__(self) -> dict[str, Any]:
        # open files and maps do not pickle; a spawned worker opens its own
        return {**self.__dict__, "_open": [None] * len(self._paths), "_offsets": [None] * len(self._paths),
                "_pid": -1}

    def _shard(self, s: int) -> _OpenShard:
        """Shard s, opened (and checked) on first use in this process."""
        if self._pid != os.getpid():  # a forked child: the parent's handles are not ours to use
            self._open = [None] * len(self._paths)
            self._pid = os.getpid()
        shard = self._open[s]
        if shard is None:
            shard = _OpenShard(self._paths[s], samples=self._samples[s], schema=self.schema,
                               schema_json=self._schema_json, offsets=self._offsets[s], stamp=self._stamps[s])
            self._offsets[s] = shard.offsets
            self._open[s] = shard
        return shard

    def close(self) -> None:
        for shard in self._open:
            if shard is not None:
                shard.close()
        self._open = [None] * len(self._paths)

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
        shard = self._shard(s)
        j = i - self._starts[s]
        out = {}
        for f in self.schema.fields:
            if f.ragged:
                off = shard.offsets[f.counter]
                out[f.name] = shard.columns[f.name].rows(int(off[j]), int(off[j + 1]))
            else:
                out[f.name] = shard.columns[f.name].rows(j, j + 1).reshape(f.shape)
        return out

    def __getitems__(self, indices: Sequence[int]) -> EventBatch:
        return self.get_batch(indices)

    def get_batch(self, indices: Any) -> EventBatch:
        """Events ``indices`` (any order, repeats allowed) as one ``EventBatch``.

        Indices that form few contiguous runs (a block of an epoch) are read run by run, one
        slice (or one h5py selection of all runs) per field and shard, then put back in the
        requested order. Scattered indices into memory-mapped (uncompressed) shards are
        gathered directly, one take per field and shard.
        """
        idx = self._check(indices)
        starts = np.asarray(self._starts, dtype=np.int64)
        shard_of = np.searchsorted(starts, idx, side="right") - 1
        touched = np.unique(shard_of).tolist()
        shards = {s: self._shard(s) for s in touched}
        runs = 1 + int(np.count_nonzero(np.diff(np.sort(idx)) != 1))
        if runs * 16 > len(idx) and all(shards[s].mapped for s in touched):
            return self._gather_mapped(idx, idx - starts[shard_of], shard_of, shards)
        return self._read_runs(idx)

    def _gather_mapped(self, idx: np.ndarray, local: np.ndarray, shard_of: np.ndarray,
                       shards: dict[int, _OpenShard]) -> EventBatch:
        """Straight into the requested order from memory-mapped shards, one take (or, for long
        events, one slice per event) per field and shard."""
        schema = self.schema
        if self._populate:
            for shard in shards.values():
                if not shard.populated:
                    shard.populate()
        groups: list[tuple[_OpenShard, Any]] = []
        if len(shards) == 1:
            groups = [(next(iter(shards.values())), slice(None))]
        elif len(shards) > 1:
            # each shard's events, found once; every field then costs O(its values)
            by_shard = np.argsort(shard_of, kind="stable")
            cuts = np.flatnonzero(np.diff(shard_of[by_shard])) + 1
            groups = [(shards[int(shard_of[ks[0]])], ks) for ks in np.split(by_shard, cuts)]
        fixed = {}
        for f in schema.fixed:
            out = np.empty((len(idx), *f.shape), dtype=f.np_dtype)
            for shard, ks in groups:
                out[ks] = shard.columns[f.name].array[local[ks]]
            fixed[f.name] = out
        ragged: dict[str, Ragged] = {}
        for c in schema.counters:
            first = np.zeros(len(idx), dtype=np.int64)
            counts = np.zeros(len(idx), dtype=np.int64)
            for shard, ks in groups:
                off, loc = shard.offsets[c], local[ks]
                first[ks] = off[loc]
                counts[ks] = off[loc + 1] - off[loc]
            offsets = starts_of(counts)
            members = schema.members(c)
            if int(offsets[-1]) and _long_runs(counts, members):
                for f in members:
                    ragged[f.name] = Ragged(_join_runs(f, shards, shard_of, first, counts), offsets)
                continue
            plans = []  # per shard: (where its values come from, where they go; None = everywhere, in order)
            for shard, ks in groups:
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
        parts = [np.diff(self._shard(s).offsets[counter]) for s in range(len(self._paths))]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def iter(self, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
             batch_size: int | None = None, block: int = 256, exact: bool = False,
             drop_last: bool = False) -> EventIterator:
        """Walk this rank's share of one epoch (see ``event_order``): events, or ``EventBatch``es.

        By default contiguous blocks of ``block`` events are visited in a shuffled order (the
        order inside a block is kept, so reads stay contiguous); ``exact=True`` shuffles every
        event. Each rank gets ``len(ds) // world_size`` events; the remainder is dropped.
        ``state_dict()`` / ``load_state_dict()`` resume exactly mid-epoch.
        """
        order = event_order(self._n, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                            block=block, exact=exact)
        config = {"shuffle": bool(shuffle), "seed": int(seed), "epoch": int(epoch), "rank": int(rank),
                  "world_size": int(world_size), "batch_size": batch_size, "drop_last": bool(drop_last),
                  "block": int(block), "exact": bool(exact)}
        return EventIterator(n=self._n, order=order, get_item=self.__getitem__, get_batch=self.get_batch,
                             config=config)


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _long_runs(counts: np.ndarray, members: tuple[Field, ...]) -> bool:
    """Whether the events' values are long enough to copy one slice per event and field."""
    return int(counts.sum()) * min(f.item_bytes for f in members) >= RUN_BYTES * len(counts)


def _join_runs(f: Field, shards: dict[int, _OpenShard], shard_of: np.ndarray, first: np.ndarray,
               counts: np.ndarray) -> np.ndarray:
    """Field ``f`` of each event, in the requested order, one slice of its shard's memory map per
    event (several times faster than a numpy gather with one index per value, for events of
    hundreds of values)."""
    size = f.item_bytes
    lo = first * size
    hi = lo + counts * size
    with no_gc():
        if len(shards) == 1:
            pieces = slices(next(iter(shards.values())).bytes_of(f.name), lo, hi)
        else:
            views: list[Any] = [None] * (max(shards) + 1)
            for s, shard in shards.items():
                views[s] = shard.bytes_of(f.name)
            pieces = [views[s][a:b] for s, a, b in zip(shard_of.tolist(), lo.tolist(), hi.tolist())]
    return join(pieces).view(f.np_dtype).reshape(-1, *f.shape)


def _join(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(empty_shape, dtype=dtype)
