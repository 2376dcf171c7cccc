"""One split's events as fixed-shape arrays, in output order: ``{split}.values.bin`` (N x L x F),
``{split}.lengths.bin`` and ``{split}.counts.bin`` (N int64), one N-row array per fixed field, and
``{split}.memmap.json`` describing them (``meta.py``).

One writer goes through a split (``rangeable`` False): the arrays are single files whose every
byte depends only on the shuffled events in order, so the bytes are the same for any ``--workers``
(which still share the reading, the shuffle and the splits). The values are padded straight into
``HashingFile``'s batch buffers (hashed and written on its threads, with O_DIRECT where the file
system takes it), a slice of events at a time, so memory stays at a few batches whatever N is.

Any number of cluster ranks gives the same bytes: gather rank 0 writes the arrays, also in cluster
stages into a bucket (``tests/test_memmap_s3.py``). Rows are padded 8 MB at a time; lengths, counts and
scalars stream to their own files; the JSON is written at ``close``, so a split of N events is never
held in memory. An empty split gets empty files (numpy cannot map them: the JSON says ``events: 0``).
The manifest's split has one shard (the values) whose ``arrays`` name the other files; ``files`` lists
them all, so ``verify`` hashes every one; the format declares ``*.bin`` and ``*.memmap.json`` as its own
(``MemmapFormat.own_files``), so ``--overwrite`` and uploads handle them. The records are the format's
own (``encoder.py``): each event already cut to L values of the dtype in the workers, so the writer
only copies each event's values into its padded row (``records.py``, ``pad.place_rows``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardsmith.core.fsutil import HashingFile, _tmp
from shardsmith.core.ragged import starts_of
from shardsmith.formats.memmap.meta import meta_bytes
from shardsmith.formats.memmap.pad import place_rows
from shardsmith.formats.memmap.records import Rows, rows_of
from shardsmith.formats.memmap.shape import Layout, file_names
from shardsmith.kit.rollover import UNLIMITED, Rollover
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

if TYPE_CHECKING:
    from shardsmith.kit.batches import SortedBatch

BATCH_BYTES = 8 << 20  # HashingFile batches of the values file; a slice of events fills at most one


class MemmapWriter(Writer):
    name = "memmap"
    suffix = ".bin"
    keeps_batches = False  # batches are decoded into new arrays

    def __init__(self, *, out_dir: Path, split: str, layout: Layout, part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.layout = layout
        self.names = file_names(split, layout)
        self.events = 0
        self.truncated = 0
        self._files: dict[str, HashingFile] | None = None  # opened on first use: a probe writer makes none

    @property
    def rangeable(self) -> bool:
        return False

    def rollover(self) -> Rollover:
        return Rollover(max_weight=UNLIMITED)  # one array set per split

    def _open(self) -> dict[str, HashingFile]:
        if self._files is None:
            files = {"values": HashingFile(self.out_dir / self.names["values"], batch_bytes=BATCH_BYTES),
                     "lengths": HashingFile(self.out_dir / self.names["lengths"]),
                     "counts": HashingFile(self.out_dir / self.names["counts"])}
            for name, rel in self.names["scalars"].items():
                files[f"scalar:{name}"] = HashingFile(self.out_dir / rel)
            self._files = files
        return self._files

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        if len(lengths):
            self._write(rows_of(lengths, payload, self.layout))

    def write_sorted(self, batch: SortedBatch) -> None:
        if len(batch.lengths):
            self._write(rows_of(batch.lengths, batch.source, self.layout, starts=batch.starts))

    def _write(self, rows: Rows) -> None:
        files = self._open()
        layout = self.layout
        step = max(1, BATCH_BYTES // max(1, layout.row_bytes))
        at = starts_of(rows.lengths)
        for a in range(0, rows.n, step):
            b = min(a + step, rows.n)
            view = files["values"].reserve((b - a) * layout.row_bytes)
            out = np.frombuffer(view, dtype=layout.dtype).reshape(b - a, layout.max_len, len(layout.features))
            place_rows(out, rows.values[at[a]:at[b]], rows.lengths[a:b], layout)
            files["lengths"].write(rows.lengths[a:b].astype("<i8").tobytes())
            files["counts"].write(rows.counts[a:b].astype("<i8").tobytes())
        self.truncated += int((rows.counts > layout.max_len).sum())
        for f in layout.scalars:
            column = np.ascontiguousarray(rows.scalars[f.name], dtype=f.np_dtype.newbyteorder("<"))
            files[f"scalar:{f.name}"].write(column.tobytes())
        self.events += rows.n

    def close(self) -> list[ShardRecord]:
        files = self._open()  # an empty split still gets its (empty) arrays and their description
        records = {key: _entry(fh) for key, fh in files.items()}
        meta = HashingFile(self.out_dir / self.names["meta"])
        meta.write(meta_bytes(split=self.split, layout=self.layout, names=self.names, events=self.events,
                              truncated=self.truncated))
        records["meta"] = _entry(meta)
        values = records.pop("values")
        arrays = {"lengths": records["lengths"], "counts": records["counts"], "meta": records["meta"],
                  "scalars": {f.name: records[f"scalar:{f.name}"] for f in self.layout.scalars}}
        self.shards = [ShardRecord(path=values["path"], samples=self.events, bytes=values["bytes"],
                                   sha256=values["sha256"], extra={"truncated": self.truncated, "arrays": arrays})]
        return self.shards

    def abort(self) -> None:
        for fh in (self._files or {}).values():
            fh.abort()
        self._files = None
        _tmp(self.out_dir / self.names["meta"]).unlink(missing_ok=True)

    def piece(self) -> dict[str, Any]:
        return {**super().piece(), "events": self.events}

    def finish_split(self, pieces: list[dict[str, Any]]) -> dict[str, Any]:
        return {"events": sum(int(p.get("events", 0)) for p in pieces)}


def _entry(fh: HashingFile) -> dict[str, Any]:
    sha = fh.commit()
    return {"path": fh.path.name, "bytes": fh.bytes, "sha256": sha}
