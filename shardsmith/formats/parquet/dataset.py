"""A split of Parquet shards as a loader dataset (``arrow_rows/whole_shards.py``): ``ds[i]`` is row
``i`` as a dict of its columns (``__key__`` first), as pyarrow reads them; a shard read whole when a
row of it is first asked for. Enough for ``verify --deep`` and ``inspect``, not yet the loader for
training runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.formats.arrow_rows.whole_shards import WholeShardRows
from shardsmith.kit.sample_kind import ListForm, SampleKind

NAME = "parquet"


class ParquetDataset(WholeShardRows):
    """One split's rows: ``len``, ``ds[i]``, ``read(indices)`` (a list of rows) and the loader's protocol."""

    kind = SampleKind("parquet rows", ListForm())
    fmt = NAME
    files_are = "Parquet"

    def read_file(self, path: Path, where: str) -> Any:
        import pyarrow.parquet as pq

        return pq.read_table(path)

    def count_rows(self, path: Path) -> int:
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
