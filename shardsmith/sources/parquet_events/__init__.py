"""Parquet event files as columnar ``EventChunk``s: one row per event, or rows grouped into events by a key.

Two layouts, chosen by ``group_by``:

* **wide** (no ``group_by``): a row is an event; its record number is the row. Numeric and bool
  columns are fixed fields, fixed-size lists fixed shapes, structs dotted fields (``met.pt``), and a
  ``list``/``large_list`` column of numbers a ragged field. Counter groups come from the schema,
  never from the data: every list column is one group ``n_<column>``, shared by the members of a
  list of structs (``jets: list<struct<pt, eta>>`` → ``jets.pt``, ``jets.eta`` counted by
  ``n_jets``). Two separate list columns whose lengths happen to agree still get a group each, so
  every file and row group gives the same schema, whatever its data.
* **long** (``group_by="event_id"``, the IceCube Kaggle ``batch_*.parquet`` layout): a row is a
  hit; consecutive rows with one key form an event, numbered by its ordinal in the file. The key
  becomes a fixed int64 field, every other numeric column a ragged field of the one group
  ``n_rows`` (rows per event), and ``events_table`` (``train_meta.parquet``) adds its per-event
  columns, joined on the key, as fixed fields. The file must be grouped by the key (sorted is the
  usual case): planning reads the key column once, cuts tasks on event boundaries and rejects a
  key that comes back after other keys.

``columns`` globs match a field's name (``jets.pt``) or its top-level column (``jets``). Strings,
binary, timestamps, lists of lists and other non-numeric columns are skipped and listed. A null
in a numeric column is a ``DataError`` naming the file and row: no silent fill value.
"""

from shardsmith.sources.parquet_events.fields import ROWS_COUNTER
from shardsmith.sources.parquet_events.reader import ParquetEventReader

__all__ = ["ROWS_COUNTER", "ParquetEventReader"]
