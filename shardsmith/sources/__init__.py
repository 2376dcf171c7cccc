"""Sources: read raw inputs (image folders, JSONL, Parquet, ROOT) as records or event chunks."""
