"""The writer of the formats that store rows as typed columns: samples cut into shards (the shard
rollover) and, within a shard, into groups (the group rollover, ``kit/rollover.py``: by the samples'
encoded sizes and counts, which depend on the samples alone, so the same files come out for any
``--workers``, ``--memory`` or ranks). Each group is typed as one table as it ends (``columns.py``)
and kept lz4-compressed until its shard ends, when the shard's groups get one schema and go, one
decoded at a time, to the format's own ``write_shard``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from shardsmith.formats.arrow_rows.columns import (
    cast_to,
    group_table,
    packed,
    packed_schema,
    unified,
    unpacked,
)
from shardsmith.kit.rollover import UNLIMITED, Rollover
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer


class GroupedRowsWriter(Writer):
    """Rolls over by ``shard_samples``/``shard_bytes`` and, within a shard, cuts groups of at most
    ``group_rows`` rows and ``group_bytes`` of samples; a subclass writes a shard (``write_shard``)."""

    keeps_batches: ClassVar[bool] = False  # every sample is decoded as it comes

    def __init__(self, *, out_dir: Path, split: str, shard_samples: int | None, shard_bytes: int | None,
                 group_rows: int | None, group_bytes: int | None, part: ShardRange | None = None,
                 types: Any = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.types = types  # the inputs' own Arrow types (``source_types.py``), or None: typed from the values
        self.shard_samples, self.shard_bytes = shard_samples, shard_bytes
        self.group_rows, self.group_bytes = group_rows, group_bytes
        self._shard = self.rollover()
        self._group = self._group_rollover()
        self._rows: list[bytes] = []  # the group being filled
        self._groups: list[Any] = []  # the shard's finished groups, packed (``columns.packed``)
        self._count = 0  # the shard's rows so far

    def rollover(self) -> Rollover:
        return Rollover(max_weight=self.shard_bytes or UNLIMITED, max_samples=self.shard_samples)

    def _group_rollover(self) -> Rollover:
        return Rollover(max_weight=self.group_bytes or UNLIMITED, max_samples=self.group_rows)

    def write_shard(self, name: str, schema: Any, tables: Iterator[Any], rows: int) -> ShardRecord:
        """Shard ``name``: ``rows`` rows, its groups as tables in ``schema`` (decoded one at a time), in order."""
        raise NotImplementedError

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        bounds = [0, *self._shard.cut(lengths), len(lengths)]
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            if k:  # a shard ends before sample a
                self._flush()
            groups = set(self._group.cut(lengths[a:b]))
            for i in range(a, b):
                if i - a in groups:
                    self._end_group()
                self._rows.append(bytes(payload[starts[i]:starts[i + 1]]))
                self._count += 1

    def shard_full(self) -> None:
        self._flush()
        self._shard = self.rollover()

    def _end_group(self) -> None:
        if self._rows:
            where = f"shard {self.shard_name(self.next_index())}"
            self._groups.append(packed(group_table(self._rows, where=where, types=self.types)))
            self._rows = []

    def _flush(self) -> None:
        self._end_group()
        self._group = self._group_rollover()
        if not self._groups:
            return
        name = self.shard_name(self.next_index())
        where = f"shard {name}"
        schema = unified([packed_schema(g) for g in self._groups], where=where, to=self.name)
        groups, self._groups = self._groups, []

        def tables() -> Iterator[Any]:
            while groups:
                yield cast_to(unpacked(groups.pop(0)), schema, where=where)

        self.shards.append(self.write_shard(name, schema, tables(), self._count))
        self.md5s.append(None)
        self._count = 0

    def close(self) -> list[ShardRecord]:
        self._flush()
        return self.shards

    def abort(self) -> None:
        self._rows, self._groups, self._count = [], [], 0
