"""A split of an MDS dataset read back by shardsmith itself (``inspect``, ``verify --deep``,
``shardsmith.open``): each shard's header and offsets checked, each sample decoded on demand as
``{column: value}`` (images as their file's bytes, not PIL images: ``streaming`` opens those).

A shard is read whole when a sample of it is first asked for (one held at a time): fine for
``inspect`` and ``verify``; a loader of large MDS datasets reads them with ``streaming`` (left for
later: reading through mapped files).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from shardsmith.errors import DatasetError
from shardsmith.formats.mds.encoding import decode_value
from shardsmith.formats.mds.shard import VERSION, column_values
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.sample_kind import ListForm, SampleKind

NAME = "mds"


class MdsShard:
    """One shard file's bytes, header and columns, checked against what the manifest says of it."""

    def __init__(self, data: bytes, *, where: str, samples: int) -> None:
        self.data, self.where = data, where
        if len(data) < 8:
            raise DatasetError(f"{where}: too short for an MDS shard")
        (n,) = struct.unpack_from("<I", data, 0)
        if n != samples or len(data) < 4 * (n + 2):
            raise DatasetError(f"{where}: holds {n} samples, the manifest says {samples}")
        self.offsets = np.frombuffer(data, dtype="<u4", count=n + 1, offset=4).astype(np.int64)
        try:
            config = json.loads(data[4 * (n + 2):int(self.offsets[0])])
            names, encodings = config["column_names"], config["column_encodings"]
        except (ValueError, KeyError, TypeError):
            raise DatasetError(f"{where}: the shard's header is not an MDS config") from None
        if config.get("version") != VERSION or config.get("format") != "mds":
            raise DatasetError(f"{where}: not an MDS shard of version {VERSION}")
        if np.any(np.diff(self.offsets) < 0) or int(self.offsets[-1]) != len(data):
            raise DatasetError(f"{where}: the sample offsets do not run to the end of the file")
        self.columns = tuple(zip(names, encodings, strict=True))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sample(self, i: int) -> dict[str, Any]:
        body = memoryview(self.data)[int(self.offsets[i]):int(self.offsets[i + 1])]
        try:
            values = column_values(self.columns, body)
            return {name: decode_value(enc, v) for (name, enc), v in zip(self.columns, values, strict=True)}
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{self.where}: sample {i} cannot be decoded ({exc})") from None


class MdsDataset(Dataset):
    """A split's samples: ``len``, ``ds[i]`` and ``read``, the loader's protocol. A shard is read (and
    its header checked) when a sample of it is first asked for, and kept while the next come from it."""

    kind = SampleKind("mds rows", ListForm())

    def __init__(self, out_dir: Any, *, split: str) -> None:
        from shardsmith.kit.dataset_files import files_for

        self.files = files_for(out_dir)
        _, self.entries = self.files.load_split(fmt=NAME, split=split)
        self.where = getattr(self.files, "where", out_dir)
        self.starts = np.cumsum([0, *(int(e["samples"]) for e in self.entries)])
        self._held: tuple[int, MdsShard] | None = None

    def shard(self, s: int) -> MdsShard:
        """Shard ``s``, read whole and checked against the manifest (kept until another is asked for)."""
        if self._held is None or self._held[0] != s:
            e = self.entries[s]
            self._held = (s, MdsShard(self.files.sidecar(e), where=f"{self.where}/{e['path']}",
                                      samples=int(e["samples"])))
        return self._held[1]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(i)
        s = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.shard(s).sample(i - int(self.starts[s]))

    def read(self, indices: Any) -> list[dict[str, Any]]:
        return [self[int(i)] for i in np.asarray(indices).reshape(-1)]
