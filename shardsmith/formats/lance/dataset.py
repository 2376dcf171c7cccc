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

from shardsmith.errors import DatasetError
from shardsmith.formats.arrow_rows.whole_shards import WholeShardRows
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


class LanceShardsDataset(WholeShardRows):
    """One split's rows: ``len``, ``ds[i]``, ``read(indices)`` (a list of rows) and the loader's protocol."""

    kind = SampleKind("lance rows", ListForm())
    fmt = NAME
    files_are = "Lance"

    def read_file(self, path: Path, where: str) -> Any:
        from shardsmith.formats.lance.names import quiet_lance

        quiet_lance()
        _not_forked(where)
        from lance.file import LanceFileReader

        return LanceFileReader(str(path)).read_all().to_table()

    def count_rows(self, path: Path) -> int:
        from shardsmith.formats.lance.names import quiet_lance

        quiet_lance()
        from lance.file import LanceFileReader

        return int(LanceFileReader(str(path)).metadata().num_rows)
