"""Packed sequences into Megatron shards: every ``.idx`` entry is one sequence of exactly
``seq_len`` tokens (documents back to back, then the pad id), and a ``{shard}.cu.npy`` beside
each shard holds where every document piece ends, in the shard's token positions (int64).

Packing needs the documents in their final order, so one writer goes through a split
(``rangeable`` False): the bytes are the same for any number of gather workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardsmith.core.fsutil import HashingFile
from shardsmith.core.npy import npy_bytes
from shardsmith.formats.tokens.masks import MASK_SUFFIX, MaskFile, ids_dtype, pad_unit, split_units
from shardsmith.formats.tokens.origins import ORIGINS_SUFFIX, check_batch, write_origins
from shardsmith.formats.tokens.packing import BestFitPacker, Window
from shardsmith.formats.tokens.writer import idx_bytes
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

if TYPE_CHECKING:
    from shardsmith.kit.batches import SortedBatch

CU_SUFFIX = ".cu.npy"
__all__ = ["CU_SUFFIX", "PackedTokensWriter", "npy_bytes"]


class PackedTokensWriter(Writer):
    """Documents in, fixed-length packed sequences out, rolling over after ``shard_tokens``; with
    ``provenance``, the origin of every document piece as placed, beside each shard; (id, mask)
    units (``--chat``): each shard's loss bits beside it, padding off (``masks.py``)."""

    name = "tokens"
    suffix = ".bin"
    keeps_batches = True  # the packer's window holds views of the batches

    def __init__(self, *, out_dir: Path, split: str, dtype: np.dtype, shard_tokens: int, seq_len: int,
                 pad_id: int, window_tokens: int, provenance: bool = False, part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.provenance = provenance
        self._origins: list[np.ndarray] = []
        self.unit = np.dtype(dtype)  # what a token is in the payload
        self.dtype = ids_dtype(self.unit)  # what it is in the shard
        self._mask: MaskFile | None = None
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.per_shard = max(1, shard_tokens // seq_len)  # whole sequences per shard
        self.packer = BestFitPacker(seq_len=seq_len, window_tokens=window_tokens)
        self._bin: HashingFile | None = None
        self._ends: list[np.ndarray] = []
        self._count = self._real = self._docs = self._split = 0
        self.flat_record: dict | None = None

    @property
    def rangeable(self) -> bool:
        return False

    def rollover(self) -> Any:  # never planned: the writer is not rangeable
        raise NotImplementedError

    def write_sorted(self, batch: SortedBatch) -> None:
        self.write_batch(batch.lengths, batch.payload, origins=batch.origins)

    def write_batch(self, lengths: np.ndarray, payload: memoryview, *, origins: np.ndarray | None = None) -> None:
        counts = np.asarray(lengths, dtype=np.int64) // self.unit.itemsize
        if self.provenance:
            origins = check_batch(origins, len(counts))
        for window in self.packer.add_batch(counts, np.frombuffer(payload, dtype=self.unit),
                                            origins=origins if self.provenance else None):
            self._write(window)

    def _write(self, window: Window) -> None:
        self._docs += window.empty
        for block in window.blocks(pad=pad_unit(self.pad_id, self.unit), dtype=self.unit):
            at, ends, origins = 0, block.ends, block.origins
            while at < len(block.rows):
                if self._bin is None:
                    self._bin = HashingFile(self.out_dir / self.shard_name(self.next_index()))
                    if self.unit != self.dtype:
                        self._mask = MaskFile(self.out_dir / self.shard_name(self.next_index(), MASK_SUFFIX))
                take = min(len(block.rows) - at, self.per_shard - self._count)
                upto = int(np.searchsorted(ends, (at + take) * self.seq_len, side="right"))
                self._ends.append(ends[:upto] + (self._count - at) * self.seq_len)
                ends = ends[upto:]
                if self.provenance:
                    assert origins is not None  # the packer carries them for every window
                    self._origins.append(origins[:upto])
                    origins = origins[upto:]
                ids, mask = split_units(block.rows[at:at + take])
                self._bin.write(memoryview(ids).cast("B"))
                if self._mask is not None and mask is not None:
                    self._mask.write(mask)
                self._real += int(block.real[at:at + take].sum())
                self._docs += int(block.documents[at:at + take].sum())
                self._split += int(block.split[at:at + take].sum())
                self._count += take
                at += take
                if self._count == self.per_shard:
                    self._roll()

    def _roll(self) -> None:
        assert self._bin is not None
        name = self._bin.path.name
        sha = self._bin.commit()
        extra: dict[str, Any] = {"tokens": self._count * self.seq_len}
        for key, suffix, data in (("index", ".idx", idx_bytes(np.full(self._count, self.seq_len), self.dtype)),
                                  ("boundaries", CU_SUFFIX, npy_bytes(np.concatenate([np.zeros(0, np.int64),
                                                                                      *self._ends])))):
            f = HashingFile(self.out_dir / self.shard_name(self.next_index(), suffix))
            f.write(data)
            extra[key] = {"path": f.path.name, "bytes": f.bytes, "sha256": f.commit()}
        if self.provenance:
            extra["origins"] = write_origins(self.out_dir / self.shard_name(self.next_index(), ORIGINS_SUFFIX),
                                             self._origins)
        if self._mask is not None:
            extra["mask"] = self._mask.commit()
        extra.update(real_tokens=self._real, documents=self._docs, documents_split=self._split)
        self.shards.append(ShardRecord(path=name, samples=self._count, bytes=self._bin.bytes, sha256=sha,
                                       extra=extra))
        self._bin, self._ends, self._origins, self._mask = None, [], [], None
        self._count = self._real = self._docs = self._split = 0

    def close(self) -> list[ShardRecord]:
        for window in self.packer.finish():
            self._write(window)
        if self._bin is not None:
            self._roll()
        if self._docs and self.shards:  # empty documents after the last sequence
            self.shards[-1].extra["documents"] += self._docs
        return self.shards

    def abort(self) -> None:
        for f in (self._bin, self._mask):
            if f is not None:
                f.abort()
