"""The options of ``convert --to parquet`` (light: ``convert --help`` reads it).

Row groups are what a reader fetches and decodes at once (``datasets`` streams one at a time, a
query engine skips them by their statistics): a row group ends after ``row_group_rows`` rows or
before it grows past ``row_group_bytes`` of samples (as the workers encoded them, about their
decoded size), whichever comes first. The shards roll over as every format's do (``SHARD_SIZE``)."""

from __future__ import annotations

from shardsmith.kit.options import MAX_COUNT, SHARD_SIZE, FormatOptions, Option

ROW_GROUP_ROWS = Option(name="row_group_rows", type="int", default=100_000, low=1, high=MAX_COUNT,
                        help="Parquet: end a row group after this many rows.")
ROW_GROUP_BYTES = Option(name="row_group_bytes", type="size", default="32MB",
                         help="Parquet: end a row group before its samples pass this size.")

OPTIONS = FormatOptions(to="parquet", options=(*SHARD_SIZE, ROW_GROUP_ROWS, ROW_GROUP_BYTES))
