"""Random access to webdataset tar shards through their offset index, trusting no file (paths,
sizes, offsets, headers); then ``ds[i]`` only slices an mmap.

A shard's member table comes from its offset index: shardsmith's own (version 2) holds every
member's place, size and extension and every sample's key. It is used only when its sha256 is the
manifest's, checked for consistency in numpy (``tarfmt.index_members``), and compared with the
tar's own headers at a few samples spread over the shard (an index of another shard, or a shard
rewritten since, is refused; ``shardsmith verify`` checks every byte of both).
Older or foreign indexes hold only where samples start: then the shard's headers are read once,
where the index points, and checked in numpy (``tarfmt.scan_samples``).

Fields come back as bytes except for kinds that are safe to decode (int, json, text, npy without
pickles); images decode only when asked. Pickle-like members (``.pyd``, ``.pth``, …) stay bytes.
"""

from __future__ import annotations

import mmap
import operator
import os
from bisect import bisect_right
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.identity import intact
from shardsmith.core.images import pixel_limit  # stdlib only: no Pillow
from shardsmith.errors import DatasetError, UsageError, install_hint
from shardsmith.formats.webdataset.decode import (
    _EXT_KINDS,
    DECODES,
    KINDS,
    _decoder,
    _safe_field_handler,
    _schema_kinds,
    load_npy,
)
from shardsmith.formats.webdataset.sample_walk import SampleIterator
from shardsmith.formats.webdataset.shard_index import _load_index, _spot_check
from shardsmith.formats.webdataset.shard_reader import (
    _compact,
    _MemberTable,
    _Open,
    _ranged_reader,
    _shard_reader,
)
from shardsmith.formats.webdataset.tarfmt import index_members, scan_samples
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.dataset_files import files_for
from shardsmith.kit.sample_kind import ListForm, SampleKind

__all__ = ["DECODES", "KINDS", "TarDataset", "load_npy"]


# A process forked after shards were mapped maps its own: os.fork's hook counts forks, so ds[i]
# need not ask for its pid (a system call) every time.
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class TarDataset(Dataset):
    """One split of a webdataset-format dataset: ``len``, ``ds[i] -> dict``, ``get_batch``, ``iter``."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train", decode: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None) -> None:
        """``out_dir``: a dataset folder, or a URL read through a local cache in ``cache_dir`` of at
        most ``cache_limit`` bytes (``shardsmith.loader.open``)."""
        if decode not in DECODES:
            raise ValueError(f"decode={decode!r}: choose one of {DECODES}")
        if decode is not None:
            try:
                import PIL.Image  # noqa: F401
            except ImportError:
                raise ImportError(f"decode={decode!r} needs Pillow: {install_hint('images')}") from None
        self._files = files_for(out_dir, cache_dir=cache_dir, cache_limit=cache_limit)
        self.out_dir = self._files.root
        self.manifest, entries = self._files.load_split(fmt="webdataset", split=split)
        self.split = split
        self.decode = decode
        self.max_image_pixels = pixel_limit(self.manifest)  # what decode="pil"/"numpy" accepts
        self._classes = _check_classes(self.manifest.get("classes"), out_dir)
        self._kinds = _schema_kinds(self.manifest.get("schema"))
        self._paths = self._files.names  # what lazy maps must find: their identities, taken now (``files``)
        self._sizes = [e["bytes"] for e in entries]
        self._indexes = [_load_index(self._files, e, path) for e, path in zip(entries, self._paths)]
        self._offsets = [offsets for offsets, _ in self._indexes]
        self._where = [str(p) for p in self._paths]
        self._starts = [0]
        for e in entries:
            self._starts.append(self._starts[-1] + e["samples"])
        self._n = self._starts[-1]
        self._decoders: dict[str, Callable[[bytes], Any] | None] = {}
        self._maps: list[mmap.mmap | None] = []
        self._tables: list[_MemberTable | None] = [None] * len(self._paths)
        self._open: list[_Open | None] = [None] * len(self._paths)
        self._pid = -1
        self._fork = -1
        self._mapped: list[int] = []  # shards mapped, oldest first (a streamed dataset keeps a few)

    # -- metadata -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    @property
    def classes(self) -> list[str] | None:
        """Class names from the manifest (index = label), or None when it records none."""
        return self._classes

    @property
    def shard_paths(self) -> list[Path]:
        """Absolute paths of this split's shards, in order (URLs for a streamed dataset)."""
        return list(self._paths)

    def __getstate__(self) -> dict[str, Any]:
        # mmaps (and image decoders, closures) do not pickle; a spawned DataLoader worker makes its own.
        return {**self.__dict__, "_maps": [], "_pid": -1, "_fork": -1, "_decoders": {},
                "_tables": [None] * len(self._paths), "_open": [None] * len(self._paths), "_mapped": []}

    # -- access ---------------------------------------------------------------------------------

    def _map(self, s: int) -> mmap.mmap:
        """Shard s, memory-mapped on first use in this process (a forked worker maps its own); a map
        already made is looked at first (``identity.intact``: a file truncated under it is a
        DatasetError, never SIGBUS)."""
        if self._pid != os.getpid():
            self._maps = [None] * len(self._paths)
            self._open = [None] * len(self._paths)
            self._mapped = []
            self._pid = os.getpid()
        mm = self._maps[s]
        if mm is None:
            fd = self._files.open(s, release=self._let_go)
            try:
                with os.fdopen(fd, "rb") as fh:
                    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise DatasetError(f"{self._where[s]}: cannot map the shard ({exc})") from None
            if len(mm) != self._sizes[s]:  # changed since the dataset was opened
                size = len(mm)
                mm.close()
                raise DatasetError(f"{self._where[s]}: {size} bytes, the manifest says {self._sizes[s]}")
            self._maps[s] = mm
            self._mapped.append(s)
            keep = self._files.keep_open
            if keep is not None and len(self._mapped) > keep:  # let the oldest go: the cache may evict it
                old = self._mapped.pop(0)
                self._maps[old] = self._open[old] = None
        else:
            intact(mm, self._where[s])
        return mm

    def _let_go(self) -> None:
        """Unmap every shard (a streamed dataset waiting for room in its cache lets go of its own)."""
        self._maps = [None] * len(self._paths)
        self._open = [None] * len(self._paths)
        self._mapped = []

    def release(self) -> None:
        """A streamed dataset unmaps every shard now (they map again when read), so its cache may
        evict them; a local one keeps its maps (nothing to evict). The loader's pipeline calls it
        when a stream's share of the epoch is done."""
        if self._files.streamed:
            self._let_go()
            self._files.let_go()

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = operator.index(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"sample index out of range for {self._n} samples")
        return self._sample(i)

    def _sample(self, i: int) -> dict[str, Any]:
        """Sample ``i`` (an int in range): its shard's reader, on the shard's own sample number."""
        s = bisect_right(self._starts, i) - 1
        return self._reader(s)(i - self._starts[s])

    def origin(self, i: int) -> tuple[str, str]:
        """(shard, ``__key__``) of sample ``i``: the key from the shard's member table, else from its
        version-2 index (a shard that cannot be mapped is still named), else its number in the shard."""
        i = operator.index(i)
        s = bisect_right(self._starts, i) - 1
        j = i - self._starts[s]
        table, full = self._tables[s], self._indexes[s][1]
        keys = table.keys if table is not None else index_members(full, where=self._where[s]).keys \
            if full is not None else None
        return self._where[s], keys[j] if keys is not None else f"#{j}"

    def _reader(self, s: int) -> _Open:
        """Shard s's reader in this process (opened on first use, and again after a fork)."""
        read = self._open[s] if self._fork == _forks else None
        return self._shard(s) if read is None else read

    def _shard(self, s: int) -> _Open:
        """Shard s ready for ds[i] in this process: mapped, its table built, a decoder per extension;
        or, streamed and not cached, a reader of byte ranges."""
        if not self._files.whole(s) and self._indexes[s][1] is not None:
            return self._ranged(s)
        if self._fork != _forks:
            self._map(s)  # a new process (or the first call): forget the parent's maps
            self._fork = _forks
        table = self._tables[s] if self._tables[s] is not None else self._table(s)
        for ext in table.exts:
            if ext not in self._decoders:
                self._decoders[ext] = self._decoder_for(ext)
        read = _shard_reader(self._map(s), table, [self._decoders[ext] for ext in table.exts], self._where[s])
        self._open[s] = read = self._files.track(s, read)
        return read

    def _ranged(self, s: int) -> _Open:
        """Shard s read sample by sample with byte ranges (a streamed shard not in the cache): the
        member table from the offset index, whose sha256 the manifest vouches for."""
        offsets, full = self._indexes[s]
        table = self._tables[s]
        if table is None:
            found = index_members(full, where=self._where[s])
            table = _MemberTable(keys=found.keys, first=_compact(found.first, "q"), data=_compact(found.data, "q"),
                                 size=_compact(found.size, "q"), exts=found.exts,
                                 ext=_compact(found.ext, "H" if len(found.exts) <= 1 << 16 else "q"))
            self._tables[s] = table  # spot-checked against the tar's headers when the shard is mapped
        for ext in table.exts:
            if ext not in self._decoders:
                self._decoders[ext] = self._decoder_for(ext)
        return self._files.track(s, _ranged_reader(lambda a, b: self._files.read(s, a, b), table,
                                                   [self._decoders[ext] for ext in table.exts], self._where[s]))

    def prefetch(self, indices: Any) -> None:
        """The samples this process reads next, in order: a streamed dataset downloads their shards
        a few ahead, within its cache's limit (a local one has nothing to do)."""
        self._files.plan(np.searchsorted(np.asarray(self._starts, np.int64), np.asarray(indices, np.int64),
                                         side="right") - 1, release=self.release)

    def _table(self, s: int) -> _MemberTable:
        """Every member of shard s, read and validated once (then ``ds[i]`` only slices)."""
        offsets, full = self._indexes[s]
        if full is not None:
            found = index_members(full, where=self._where[s])
            _spot_check(self._map(s), found, np.frombuffer(offsets, np.int64), where=self._where[s])
        else:
            found = scan_samples(self._map(s), np.frombuffer(offsets, np.int64), where=self._where[s])
        table = _MemberTable(keys=found.keys, first=_compact(found.first, "q"), data=_compact(found.data, "q"),
                             size=_compact(found.size, "q"), exts=found.exts,
                             ext=_compact(found.ext, "H" if len(found.exts) <= 1 << 16 else "q"))
        self._tables[s] = table
        return table

    def check_indexes(self) -> None:
        """Every shard's member table from its offset index, checked as first use checks it (the table
        itself, and a few samples against the tar's headers): what ``verify`` without ``--deep`` reads,
        so that an index which lies (its manifest entry made to agree) is not passed unread."""
        for s in range(len(self._paths)):
            if self._tables[s] is None:
                self._table(s)

    def check_headers(self) -> None:
        """Read every tar header of every shard and check it against the shard's offset index:
        what a version-2 index spares ``ds[i]`` beyond its few spot checks (``verify --deep``).
        DatasetError names the first shard and sample that differ."""
        for s, where in enumerate(self._where):
            offsets, full = self._indexes[s]
            scanned = scan_samples(self._map(s), np.frombuffer(offsets, np.int64), where=where)
            if full is None:
                continue  # a version-1 index: the scan is the table, and it has just passed
            table = index_members(full, where=where)
            names = np.asarray(table.exts + [""], object)  # extensions by name: the two number them alike, or not
            if (table.keys == scanned.keys and np.array_equal(table.first, scanned.first)
                    and np.array_equal(table.data, scanned.data) and np.array_equal(table.size, scanned.size)
                    and np.array_equal(names[table.ext], np.asarray(scanned.exts + [""], object)[scanned.ext])):
                continue
            for j in range(len(table.keys)):  # the first sample that differs, for the message
                a, b = int(table.first[j]), int(table.first[j + 1])
                c, d = int(scanned.first[j]), int(scanned.first[j + 1])
                if (table.keys[j] != scanned.keys[j] or b - a != d - c
                        or not np.array_equal(table.data[a:b], scanned.data[c:d])
                        or not np.array_equal(table.size[a:b], scanned.size[c:d])
                        or [table.exts[e] for e in table.ext[a:b]] != [scanned.exts[e] for e in scanned.ext[c:d]]):
                    raise DatasetError(f"{where}: the offset index does not describe sample {j} at byte "
                                       f"{int(np.frombuffer(offsets, np.int64)[j])} as the tar's headers do")

    def member_bytes(self, ext: str) -> list[bytes | None]:
        """Member ``ext`` of every sample in index order, raw (None where a sample has none):
        one pass over the member tables, slicing only that member (e.g. labels for balancing)."""
        out: list[bytes | None] = []
        for s in range(len(self._paths)):
            # mapped whole (a streamed shard: downloaded into the cache; a range per sample would cost
            # a request each), and tabled in this process
            mm = self._map(s)
            table = self._tables[s] if self._tables[s] is not None else self._table(s)
            e = table.exts.index(ext) if ext in table.exts else -1
            first, ext_of = np.frombuffer(table.first, np.int64), np.frombuffer(table.ext, table.ext.typecode)
            where = np.full(len(first) - 1, -1, np.int64)
            hits = np.flatnonzero(ext_of == e) if e >= 0 else np.zeros(0, np.int64)
            where[np.searchsorted(first, hits, side="right") - 1] = hits
            data, size = table.data, table.size
            out.extend(None if k < 0 else mm[data[k]:data[k] + size[k]] for k in where.tolist())
        return out

    def member_sizes(self, i: int) -> dict[str, int]:
        """Sample ``i``'s members and their sizes in bytes, from its shard's member table: nothing
        decoded (``inspect --report``'s bytes per sample)."""
        i = operator.index(i) % max(self._n, 1)
        s = bisect_right(self._starts, i) - 1
        table = self._tables[s] if self._tables[s] is not None else self._table(s)
        j = i - self._starts[s]
        return {table.exts[table.ext[k]]: int(table.size[k]) for k in range(table.first[j], table.first[j + 1])}

    def labels(self, field: str = "cls") -> np.ndarray:
        """Every sample's integer label (member ``field``, e.g. the image folder's ``cls``), int64."""
        raw = self.member_bytes(field)
        try:
            return np.array([int(b) for b in raw], np.int64)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            bad = next(i for i, b in enumerate(raw) if b is None or not b.strip().isdigit())
            raise DatasetError(f"{self.out_dir}: sample {bad} has no integer {field!r} member") from None

    def _decoder_for(self, ext: str) -> Callable[[bytes], Any] | None:
        kind = self._kinds.get(ext) or _EXT_KINDS.get(ext.rsplit(".", 1)[-1].lower(), "bytes")
        if kind == "npy":
            return load_npy
        return _decoder(kind, self.decode, self.max_image_pixels)

    @property
    def kind(self) -> SampleKind:
        return SampleKind("tar samples", ListForm(), (("decode", self.decode),))

    def read(self, indices: Any) -> list[dict[str, Any]]:
        """The samples at ``indices``, in that order. Each shard's file is looked at (``intact``) before
        the batch's first sample in it, not before every sample: a batch is one read."""
        if type(self).__getitem__ is not TarDataset.__getitem__:  # a subclass's own samples
            return [self[int(i)] for i in np.asarray(indices).reshape(-1)]
        out, looked, starts, n = [], set(), self._starts, self._n
        for i in np.asarray(indices).reshape(-1).tolist():
            i = int(i)
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"sample index out of range for {n} samples")
            s = bisect_right(starts, i) - 1
            out.append(self._reader(s)(i - starts[s], s not in looked))
            looked.add(s)
        return out

    get_batch = read

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return self.read(indices)

    def samples(self, indices: np.ndarray) -> Iterator[dict[str, Any]]:
        """The samples at ``indices`` one at a time: this class's own sliced a block ahead out of
        the shards' maps (``sample_walk.py``); a subclass's ``ds[i]`` each."""
        walk = self.samples_mended
        return super().samples(indices) if walk is None else walk(indices)

    @property
    def samples_mended(self) -> Callable[..., SampleIterator] | None:  # type: ignore[override]
        """This class's own walk, which mends (``kit/dataset.py``); None for a subclass's ``ds[i]``."""
        return partial(SampleIterator, self) if type(self).__getitem__ is TarDataset.__getitem__ else None

    def webdataset(self, *, decode: str | None = None, **kwargs: Any) -> Any:
        """A ``webdataset.WebDataset`` over the shards in order, for users who prefer that API.

        ``decode`` (e.g. ``"pil"``, ``"rgb8"``) adds webdataset's image decoder plus shardsmith's
        safe field decoders, never webdataset's default ones, which unpickle ``.pyd``.
        """
        try:
            import webdataset as wds
        except ImportError:
            raise UsageError(f"TarDataset.webdataset() needs the webdataset package: {install_hint('webdataset')}") from None

        kwargs.setdefault("shardshuffle", False)
        pipeline = wds.WebDataset([str(p) for p in self._paths], **kwargs)
        if decode is not None:
            pipeline = pipeline.decode(decode, pre=[], post=[_safe_field_handler])
        return pipeline


def _check_classes(classes: Any, out_dir: Any) -> list[str] | None:
    if classes is None:
        return None
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise DatasetError(f"{out_dir}: manifest 'classes' is not a list of names")
    return classes

