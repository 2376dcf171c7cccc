"""A split of Lance shards as a loader dataset: ``ds[i]`` is row ``i`` as a dict of its columns
(``__key__`` first), as pylance gives them. Each shard's data file is read on its own (pylance's
file reader), so a dataset at a URL reads through the same cached files as every format's; a
shard is read whole when a row of it is first asked for and kept while the next rows come from it.
Enough for ``verify --deep`` and ``inspect``; training loops read the table with pylance itself
(``lance.dataset(OUT / "train.lance").take(...)``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.errors import DatasetError
from shardsmith.formats.parquet.rows import KEY
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.sample_kind import ListForm, SampleKind

NAME = "lance"
_LOADED_BY: int | None = None  # the process that first read a Lance file here (pylance is not fork-safe)


def _not_forked(where: str) -> None:
    """Refuse, in one line, to read with pylance in a process forked from one that already did: such a
    child can crash the interpreter (signal 11) inside pylance (a DataLoader's default workers)."""
    global _LOADED_BY
    if _LOADED_BY is not None and os.getpid() != _LOADED_BY:
        raise DatasetError(f"{where}: a Lance dataset read in a process forked after its parent read it: pylance "
                           f"is not fork-safe (it can crash the process); start workers with 'spawn' or "
                           f"'forkserver' (DataLoader(multiprocessing_context='spawn')), or open the dataset "
                           f"in each worker")
    _LOADED_BY = os.getpid()


class LanceShardsDataset(Dataset):
    """One split's rows: ``len``, ``ds[i]``, ``read(indices)`` (a list of rows) and the loader's protocol."""

    kind = SampleKind("lance rows", ListForm())

    def __init__(self, out_dir: str | Path | Any, *, split: str) -> None:
        from shardsmith.kit.dataset_files import files_for

        self.files = files_for(out_dir)
        self.out_dir = out_dir
        self.split = split
        _, self.shards = self.files.load_split(fmt=NAME, split=split)
        self.ends = np.cumsum([int(s["samples"]) for s in self.shards], dtype=np.int64)
        self._held: tuple[int, Any] | None = None

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def table(self, s: int) -> Any:
        """Shard ``s`` read whole (kept until another is asked for), its rows counted against the manifest."""
        if self._held is not None and self._held[0] == s:
            return self._held[1]
        from shardsmith.formats.lance.names import quiet_lance

        quiet_lance()
        _not_forked(self.shards[s]["path"])
        from lance.file import LanceFileReader

        path, _, fd = self.files.local(s)
        try:
            table = LanceFileReader(str(path)).read_all().to_table()
        except Exception as exc:  # pylance's errors for a file that is not a Lance file
            raise DatasetError(f"{self.shards[s]['path']}: not a readable Lance file ({exc})") from None
        finally:
            if fd is not None:
                os.close(fd)
        if table.num_rows != int(self.shards[s]["samples"]):
            raise DatasetError(f"{self.shards[s]['path']}: {table.num_rows} rows, the manifest says "
                               f"{self.shards[s]['samples']}")
        self._held = (s, table)
        return table

    def where(self, i: int) -> tuple[int, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} of a split of {len(self)}")
        s = int(np.searchsorted(self.ends, i, side="right"))
        return s, i - (int(self.ends[s - 1]) if s else 0)

    def __getitem__(self, i: int) -> dict[str, Any]:
        s, j = self.where(int(i))
        return self.table(s).slice(j, 1).to_pylist()[0]  # type: ignore[no-any-return]

    def read(self, indices: Any) -> list[dict[str, Any]]:
        return [self[int(i)] for i in np.asarray(indices).reshape(-1)]

    def origin(self, i: int) -> tuple[str, str]:
        s, _ = self.where(int(i))
        return self.shards[s]["path"], str(self[int(i)][KEY])
