"""Parquet shards of rows as a registered format: one ``{split}-{000000}.parquet`` per shard, each
sample field a typed column and ``__key__`` a column too, in the shuffle's order (``writer.py``:
the settings; ``columns.py``: the types). The workers hand it typed samples (``Format.encoder``:
``rows.py``); the dataset card lets ``load_dataset(OUT)`` read it (``card.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.core.own_files import OwnFiles
from shardsmith.formats.arrow_rows.format import ColumnsFormat
from shardsmith.formats.parquet.options import OPTIONS
from shardsmith.formats.parquet.writer import SETTINGS, SUFFIX
from shardsmith.kit.format import CardData, WriteJob
from shardsmith.kit.writer import ShardRange, Writer


class ParquetFormat(ColumnsFormat):
    name = "parquet"
    manifest_format = "parquet"
    option = OPTIONS.to
    options = OPTIONS
    accepts = ("rows",)
    sample_unit = "row"
    own_files = OwnFiles(files=("*-" + "[0-9]" * 6 + SUFFIX,))  # {split}-{000000}.parquet

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.parquet.writer import ParquetShardWriter

        o = job.options
        return ParquetShardWriter(out_dir=job.out, split=split, shard_samples=o.shard_samples,
                                  shard_bytes=o.shard_bytes, group_rows=o.row_group_rows,
                                  group_bytes=o.row_group_bytes, part=part, types=job.schema)

    def manifest_fields(self, job: WriteJob, outputs: dict[str, Any]) -> dict[str, Any]:
        """The writer's fixed settings, so a reader of the manifest knows how the files were made."""
        return {"parquet": {k: SETTINGS[k] for k in ("compression", "compression_level", "version")}}

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        from shardsmith.formats.parquet.dataset import ParquetDataset

        return ParquetDataset(out_dir, split=split)

    def verify_layout(self, out: Any, manifest: dict[str, Any], split: str) -> list[str]:
        """Every shard's footer: a Parquet file of as many rows as the manifest says."""
        return self.open(out, split=split).footer_problems()  # type: ignore[no-any-return]

    def describe(self, out: Any, manifest: dict[str, Any]) -> dict[str, Any]:
        """The writer's settings and the row groups' limits, as one line of ``inspect``."""
        settings, options = manifest.get("parquet") or {}, manifest.get("format_options") or {}
        line = (f"parquet: {settings.get('compression')} level {settings.get('compression_level')}, row groups of at "
                f"most {options.get('row_group_rows')} rows and {options.get('row_group_bytes')} bytes of samples")
        return {"parquet": settings, "format_lines": [line]}

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        from shardsmith.formats.parquet.card import parquet_card

        return parquet_card(out, manifest)
