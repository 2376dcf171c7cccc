"""A split of shards of typed rows as a loader dataset: ``ds[i]`` is row ``i`` as a dict of its
columns (``__key__`` first). A shard is read whole (the format's ``read_file``) when a row of it is
first asked for, its rows counted against the manifest, and kept while the next rows come from it
(the loader reads them in shard order when it does not shuffle): enough for ``verify --deep`` and
``inspect``, not yet the loader for training runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from shardsmith.errors import DatasetError
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.sample import KEY


class WholeShardRows(Dataset):
    """One split's rows: ``len``, ``ds[i]``, ``read(indices)`` (a list of rows) and the loader's
    protocol; a subclass names its format (``fmt``; ``files_are``: its files, as errors call them)
    and reads one file into an Arrow table (``read_file``)."""

    fmt: ClassVar[str]
    files_are: ClassVar[str]  # "Parquet": "not a readable Parquet file"

    def __init__(self, out_dir: str | Path | Any, *, split: str) -> None:
        from shardsmith.kit.dataset_files import files_for

        self.files = files_for(out_dir)
        self.out_dir = out_dir
        self.split = split
        _, self.shards = self.files.load_split(fmt=self.fmt, split=split)
        self.ends = np.cumsum([int(s["samples"]) for s in self.shards], dtype=np.int64)
        self._held: tuple[int, Any] | None = None

    def read_file(self, path: Path, where: str) -> Any:
        """The file at ``path`` (shard ``where``) as one Arrow table."""
        raise NotImplementedError

    def count_rows(self, path: Path) -> int:
        """The rows the file at ``path`` says it holds (its footer), without reading them."""
        raise NotImplementedError

    def footer_problems(self) -> list[str]:
        """``verify``: each shard a readable file of as many rows as the manifest says (footers only)."""
        problems = []
        for s, shard in enumerate(self.shards):
            path, _, fd = self.files.local(s)
            try:
                rows = self.count_rows(path)
            except Exception as exc:  # the reader's own errors for a file that is not one of its format
                problems.append(f"{shard['path']}: not a readable {self.files_are} file ({exc})")
                continue
            finally:
                if fd is not None:
                    os.close(fd)
            if rows != int(shard["samples"]):
                problems.append(f"{shard['path']}: {rows} rows, the manifest says {shard['samples']}")
        return problems

    def deep_problems(self) -> list[str]:
        """``verify --deep``: every shard read whole (every page decoded), every row keyed."""
        try:
            for s in range(len(self.shards)):
                keys = self.table(s).column(KEY)
                if keys.null_count:
                    return [f"{self.shards[s]['path']}: {keys.null_count} rows have no {KEY}"]
        except DatasetError as exc:
            return [str(exc)]
        return []

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def table(self, s: int) -> Any:
        """Shard ``s`` read whole (kept until another is asked for), its rows counted against the manifest."""
        if self._held is not None and self._held[0] == s:
            return self._held[1]
        where = self.shards[s]["path"]
        path, _, fd = self.files.local(s)
        try:
            table = self.read_file(path, where)
        except DatasetError:
            raise
        except Exception as exc:  # the reader's own errors for a file that is not one of its format
            raise DatasetError(f"{where}: not a readable {self.files_are} file ({exc})") from None
        finally:
            if fd is not None:
                os.close(fd)
        if table.num_rows != int(self.shards[s]["samples"]):
            raise DatasetError(f"{where}: {table.num_rows} rows, the manifest says {self.shards[s]['samples']}")
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


def shown(sample: dict[str, Any]) -> dict[str, Any]:
    """A row as ``inspect`` shows it: its key, and each column's value (long ones by their size)."""
    return {"key": sample[KEY], "members": {k: _short(v) for k, v in sample.items() if k != KEY}}


def _short(value: Any) -> Any:
    if isinstance(value, bytes | str) and len(value) > 40:
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, list | dict) and len(value) > 8:
        return f"{type(value).__name__} of {len(value)}"
    return value
