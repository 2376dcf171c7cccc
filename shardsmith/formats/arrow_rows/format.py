"""What the formats that store typed columns share as formats: the workers' encoding of their
samples (``rows.py``), ``verify --deep`` over their whole-shard datasets and ``inspect``'s row."""

from __future__ import annotations

from typing import Any

from shardsmith.errors import DatasetError
from shardsmith.kit.format import Format, WriteJob
from shardsmith.kit.sample import SampleEncoder


class ColumnsFormat(Format):
    """A format whose writer is a ``GroupedRowsWriter`` and whose ``open`` is a ``WholeShardRows``."""

    def encoder(self, job: WriteJob, kind: str) -> SampleEncoder:
        """The typed sample, encoded so that the writer reads a group's back at once (``rows.py``)."""
        from shardsmith.formats.arrow_rows.rows import RowEncoder

        return RowEncoder()

    def verify_deep(self, out: Any, manifest: dict[str, Any], split: str) -> list[str]:
        """Every shard read whole (every page decompressed and decoded), every row keyed."""
        try:
            return self.open(out, split=split).deep_problems()  # type: ignore[no-any-return]
        except DatasetError as exc:
            return [str(exc)]

    def show_one(self, sample: Any) -> dict[str, Any]:
        """A row: its key, and each column's value (long ones by their size)."""
        from shardsmith.formats.arrow_rows.whole_shards import shown

        return shown(sample)
