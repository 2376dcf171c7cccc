"""Random access to a memmap split: the arrays a user would ``np.memmap``, with the loader's
``len``, ``ds[i]``, ``get_batch`` and resumable ``iter``, and a reader API (``values``,
``lengths``, ``counts``, ``scalars``, ``field_values``) for whoever looks at the data (inspect,
reports).

Paths come from the split's JSON only after it agrees with the manifest (``meta.read_meta``); the
files are stamped when the dataset is made and mapped lazily in each process (a forked
DataLoader worker maps its own), checked against those stamps. Nothing is unpickled.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import recycle
from shardsmith.core.identity import Stamp, intact, open_checked, stamp
from shardsmith.core.provenance import inputs_of
from shardsmith.errors import DatasetError
from shardsmith.formats.memmap.meta import Array, SplitArrays, read_meta
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.dataset_files import files_for
from shardsmith.kit.order import window_of
from shardsmith.kit.sample_kind import MappingForm, SampleKind


class MemmapDataset(Dataset):
    """One split: ``ds[i]`` -> ``{"values": (L, F), "length", "count", "scalars": {name: value}}``;
    ``get_batch(idx)`` -> ``{"values": (B, L, F), "lengths", "counts", "scalars": {name: (B, ...)}}``."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train") -> None:
        files = files_for(out_dir)
        if files.streamed:
            raise DatasetError(f"{files.where}: memmap datasets are mapped from a local folder; download it "
                               f"first (e.g. aws s3 sync URL DIR) and open the folder")
        self.out_dir = Path(files.root)
        self.manifest, _ = files.load_split(fmt="memmap", split=split)
        self.split = split
        self.arrays: SplitArrays = read_meta(self.out_dir, self.manifest, split)
        every = [self.arrays.values, self.arrays.lengths, self.arrays.counts, *self.arrays.scalars.values()]
        self._stamps = {a.path: stamp(a.path, size=_nbytes(a)) for a in every}
        meta = self.arrays.meta
        self.fields: list[str] = list(self.arrays.fields)
        self.max_len = int(meta["max_len"])
        self.dtype = self.arrays.values.dtype
        self.pad_value = float(meta["pad_value"])
        self.keep = str(meta["keep"])
        self.inputs: list[str] | None = inputs_of(self.manifest)  # what ``_file`` indexes (--provenance)
        self._n = self.arrays.values.shape[0]
        self._maps: dict[Path, tuple[np.ndarray, mmap.mmap | None]] = {}  # (the array, its map)
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self._n

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}, "_pid": -1}

    # -- the arrays, as a user's script maps them ---------------------------------------------------

    def _map(self, a: Array) -> np.ndarray:
        if self._pid != os.getpid():  # a forked worker maps its own
            self._maps, self._pid = {}, os.getpid()
        got = self._maps.get(a.path)
        if got is None:
            got = self._maps[a.path] = _mapped(a, self._stamps[a.path])
        elif got[1] is not None:
            intact(got[1], a.path)  # a file truncated under its map: an error, not SIGBUS
        return got[0]

    @property
    def values(self) -> np.ndarray:
        """``(N, L, F)``, read-only, mapped."""
        return self._map(self.arrays.values)

    @property
    def lengths(self) -> np.ndarray:
        """Each event's stored values (at most L); row i is padding past ``lengths[i]``."""
        return self._map(self.arrays.lengths)

    @property
    def counts(self) -> np.ndarray:
        """Each event's values before truncation (its multiplicity)."""
        return self._map(self.arrays.counts)

    @property
    def scalars(self) -> dict[str, np.ndarray]:
        """Event-level fields, each ``(N, ...)``."""
        return {name: self._map(a) for name, a in self.arrays.scalars.items()}

    def mask(self, lengths: np.ndarray) -> np.ndarray:
        """``(B, L)`` bool: True where a row holds data."""
        return np.arange(self.max_len) < np.asarray(lengths)[:, None]

    def field_values(self, name: str, *, limit: int | None = None) -> np.ndarray:
        """Every stored (not padding) value of feature ``name``, of the first ``limit`` events (all)."""
        j = self.fields.index(name)
        n = self._n if limit is None else min(limit, self._n)
        out = [self.values[a:a + 4096, :, j][self.mask(self.lengths[a:a + 4096])] for a in range(0, n, 4096)]
        return np.concatenate(out) if out else np.zeros(0, self.dtype)

    def labels(self, field: str = "label") -> np.ndarray:
        """Every event's integer label from the event-level field ``field`` (for ``BalancedSampler``)."""
        a = self.arrays.scalars.get(field)
        if a is None or len(a.shape) != 1 or a.dtype.kind not in "iub":
            raise DatasetError(f"{self.out_dir}: labels need an integer event-level field; {field!r} is not one here")
        return np.asarray(self._map(a), dtype=np.int64)

    # -- the loader's interface ---------------------------------------------------------------------

    @property
    def kind(self) -> SampleKind:
        scalars = tuple((name, a.dtype.str, tuple(a.shape[1:])) for name, a in self.arrays.scalars.items())
        return SampleKind("memmap events", MappingForm(), (("fields", tuple(self.fields)), ("max_len", self.max_len),
                                                           ("dtype", self.dtype.str), ("scalars", scalars)))

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        if not -self._n <= i < self._n:
            raise IndexError(f"event {i} of {self._n}")
        i %= max(self._n, 1)
        return {"values": np.array(self.values[i]), "length": int(self.lengths[i]), "count": int(self.counts[i]),
                "scalars": {name: np.array(v[i]) for name, v in self.scalars.items()}}

    def read(self, indices: Any) -> dict[str, Any]:
        """Events ``indices`` (any order, repeats allowed): a window of contiguous events is one slice per
        array, others one take per array, straight into the requested order (one copy, into
        ``core.recycle``'s memory: no page faults per batch)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < -self._n or idx.max() >= self._n):
            raise IndexError(f"an index of the batch is out of range for {self._n} events")
        idx = idx % max(self._n, 1)
        if (window := window_of(idx)) is not None:

            def take(array: np.ndarray) -> np.ndarray:
                return recycle.copy(array[window])
        else:
            def take(array: np.ndarray) -> np.ndarray:
                out = recycle.BATCHES.empty((len(idx), *array.shape[1:]), array.dtype)
                # every index is checked above: "clip" changes none, and lets numpy skip a buffered copy
                return np.take(array, idx, axis=0, out=out, mode="clip")
        return {"values": take(self.values), "lengths": take(self.lengths), "counts": take(self.counts),
                "scalars": {name: take(v) for name, v in self.scalars.items()}}

    get_batch = read

    def check(self) -> list[str]:
        """``verify --deep``: lengths within L and their counts, and padding where the JSON says."""
        problems = []
        lengths, counts = self.lengths, self.counts
        if len(lengths) and (lengths.min() < 0 or lengths.max() > self.max_len):
            problems.append(f"{self.arrays.lengths.path.name}: a length is outside 0..{self.max_len}")
        elif np.any(lengths > counts) or np.any(lengths != np.minimum(counts, self.max_len)):
            problems.append(f"{self.arrays.lengths.path.name}: lengths disagree with the counts and max_len")
        else:
            for a in range(0, self._n, 4096):
                rows = self.values[a:a + 4096]
                pad = ~self.mask(lengths[a:a + 4096])
                if np.any(rows[pad] != self.pad_value):
                    problems.append(f"{self.arrays.values.path.name}: events {a}..{a + len(rows) - 1} hold values "
                                    f"past their lengths (the padding must be {self.pad_value})")
                    break
        return problems


def _nbytes(a: Array) -> int:
    return int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize


def _mapped(a: Array, want: Stamp) -> tuple[np.ndarray, mmap.mmap | None]:
    """The file as a read-only array of its JSON's shape, and its map (an empty one: no map, numpy
    cannot map 0 bytes)."""
    if _nbytes(a) == 0:
        return np.zeros(a.shape, a.dtype), None
    fd = open_checked(a.path, want)
    try:
        mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=a.dtype).reshape(a.shape), mm
