"""Rows as typed Arrow tables, shared by the formats that store columns (``parquet``, ``lance``): the
workers' encoding of a sample (``rows.py``), a group of samples typed into one table and a shard's
groups given one schema (``columns.py``), and the writer that cuts shards into such groups
(``grouped.py``). Not a format: no registration names it."""
