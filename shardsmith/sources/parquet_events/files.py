"""Opening a Parquet file (pages checked against their checksums) and estimating a row group's
decoded size from its metadata."""

from __future__ import annotations

from typing import Any

from shardsmith.core.input_file import InputFile
from shardsmith.errors import DataError

_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def _decoded_bytes(rg: Any, columns: list[str] | None) -> int:
    """About how many bytes a row group's ``columns`` (all if None) take once decoded: values times their
    width. ``total_byte_size`` would not do: it counts the encoded pages, a few bytes for a run of repeats."""
    total = 0
    for j in range(rg.num_columns):
        c = rg.column(j)
        path = c.path_in_schema
        if columns is not None and not any(path == n or path.startswith(n + ".") for n in columns):
            continue
        width = _WIDTH.get(c.physical_type)
        total += c.num_values * width if width else c.total_uncompressed_size
    return total


def _open(file: InputFile) -> Any:
    return _open_path(file.path, file.rel)


def _open_path(path: str, rel: str | None = None) -> Any:
    import pyarrow.parquet as pq

    try:  # pages written with checksums are verified: a flipped byte is an error, not silent garbage
        return pq.ParquetFile(path, page_checksum_verification=True)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a file that is not (whole) Parquet
        # an input file that cannot be read is skippable (``--on-error skip`` leaves it out); the events
        # table (no ``rel``) is not an input: the run cannot go on without it
        raise DataError(file=rel or path, reason=f"not a readable Parquet file: {exc}",
                        skippable=rel is not None) from None
