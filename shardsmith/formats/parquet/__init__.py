"""Parquet files of rows, one file per shard, that pyarrow, HuggingFace ``datasets``, Polars and
DuckDB read: each sample field a typed column, ``__key__`` a column too, in the shuffle's order."""
