"""Megatron-compatible indexed datasets: ``{split}-{000000}.bin`` + ``.idx`` (``MMIDIDX``), one
sequence per document, plus an optional flat nanoGPT ``{split}.bin``.

The .idx layout (Megatron-LM ``megatron/core/datasets/indexed_dataset.py``): magic
``MMIDIDX\\x00\\x00``, u64 version 1, u8 dtype code, u64 sequence count S, u64 document count S+1,
int32 sequence lengths[S], int64 byte pointers[S], int64 document indices[S+1] = 0..S.

The dtype is ``uint16`` when the vocabulary has fewer than 65,500 entries, else ``int32``:
megatron-core's own rule (0.16, ``DType.optimal_dtype(cardinality)`` in ``indexed_dataset.py``:
``uint16`` when ``cardinality < 65500``, which Megatron-LM's ``preprocess_data.py`` calls with the
vocabulary size; a test holds us to it at the edges). Ids below 65,536 would fit ``uint16``, but a
shard whose dtype differs from Megatron's own files for the same tokenizer would surprise more than
the 36 spare ids help. nanoGPT's flat files are ``uint16`` whatever the shards' dtype, for
vocabularies up to 65,536 (``--nanogpt`` is refused above). Megatron-LM and NeMo read each shard
prefix as it is (tested with megatron-core).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardsmith.core.fsutil import HashingFile, file_sha256, fsync_dir, naming
from shardsmith.core.ragged import starts_of
from shardsmith.errors import DatasetError
from shardsmith.formats.tokens.masks import MASK_SUFFIX, MaskFile, ids_dtype, split_units
from shardsmith.formats.tokens.neighbours import nanogpt_name
from shardsmith.formats.tokens.origins import ORIGINS_SUFFIX, check_batch, write_origins
from shardsmith.kit.rollover import Rollover, runs
from shardsmith.kit.writer import ShardRange, ShardRecord, Writer

if TYPE_CHECKING:
    from shardsmith.kit.batches import SortedBatch

IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_VERSION = 1
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16}
CODE_OF = {np.dtype(v).name: k for k, v in DTYPE_CODES.items()}


def idx_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The .idx file of one shard whose documents have these token lengths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    header = IDX_MAGIC + struct.pack("<Q", IDX_VERSION) + struct.pack("<B", CODE_OF[dtype.name])
    header += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(lengths) + 1)
    return b"".join([header, lengths.astype(np.int32).tobytes(), pointers.tobytes(),
                     np.arange(len(lengths) + 1, dtype=np.int64).tobytes()])


class _FlatPiece:
    """This writer's stretch of the nanoGPT file: the whole file (hashed while written), or a
    range of a scratch file that other writers fill at the same time (positional writes)."""

    def __init__(self, *, out_dir: Path, split: str, part: ShardRange) -> None:
        self.offset = part.weight_before * 2
        self.tokens = 0
        if part.whole:
            self._file: HashingFile | None = HashingFile(out_dir / nanogpt_name(split))
            self._fd = -1
        else:
            assert part.work_dir is not None
            self._file = None
            path = flat_scratch(part.work_dir, split)
            with naming(path):
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

    def write(self, data: bytes | memoryview) -> None:
        if self._file is not None:
            self._file.write(data)
        else:
            at = self.offset + 2 * self.tokens
            view = memoryview(data).cast("B")
            while len(view):
                done = os.pwrite(self._fd, view, at)
                view, at = view[done:], at + done
        self.tokens += len(data) // 2

    def close(self) -> dict[str, Any]:
        if self._file is not None:
            sha = self._file.commit()
            return {"path": self._file.path.name, "bytes": self._file.bytes, "sha256": sha, "dtype": "uint16"}
        try:
            os.fsync(self._fd)  # on the disk before the piece that vouches for it
        finally:
            os.close(self._fd)
        return {"offset": self.offset, "tokens": self.tokens}

    def abort(self) -> None:
        if self._file is not None:
            self._file.abort()
        elif self._fd >= 0:
            os.close(self._fd)


def flat_scratch_name(split: str) -> str:
    """The scratch file (in the run's scratch folder) the gather ranges of a split fill with the nanoGPT file."""
    return f"flat-{split}.bin"


def flat_scratch(work_dir: Path, split: str) -> Path:
    return Path(work_dir) / flat_scratch_name(split)


class TokensWriter(Writer):
    """Writes one split's documents (token arrays in ``dtype``) into rolling Megatron shards; with
    ``provenance``, each shard's document origins beside it (``formats/tokens/origins.py``); a
    ``dtype`` of (id, mask) units (``--chat``) writes each shard's loss bits beside it (``masks.py``)."""

    name = "tokens"
    suffix = ".bin"

    def __init__(self, *, out_dir: Path, split: str, dtype: np.dtype, shard_tokens: int,
                 nanogpt: bool = False, provenance: bool = False, part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.provenance = provenance
        self._origins: list[np.ndarray] = []
        self.unit = np.dtype(dtype)  # what a token is in the payload
        self.dtype = ids_dtype(self.unit)  # what it is in the shard
        self._mask: MaskFile | None = None
        self.shard_tokens = shard_tokens
        self.nanogpt = nanogpt
        self._bin: HashingFile | None = None
        self._lengths: list[np.ndarray] = []
        self._roller = self.rollover()
        self._flat: _FlatPiece | None = None
        self.flat_record: dict | None = None

    def rollover(self) -> Rollover:
        return Rollover(max_weight=self.shard_tokens)

    def weights(self, lengths: np.ndarray, payload: memoryview | None) -> np.ndarray:
        return np.asarray(lengths, dtype=np.int64) // self.unit.itemsize

    def total_weight(self, payload_bytes: int) -> int | None:
        """Tokens of documents whose ids total ``payload_bytes`` (each a whole number of ids): the
        gather's plan skips a group that fits in a shard whole instead of reading its heads."""
        return payload_bytes // self.unit.itemsize

    def write_sorted(self, batch: SortedBatch) -> None:
        self.write_batch(batch.lengths, batch.payload, origins=batch.origins)

    def write_batch(self, lengths: np.ndarray, payload: memoryview, *, origins: np.ndarray | None = None) -> None:
        """Append documents (lengths in bytes, payload back to back), rolling over at ``shard_tokens``;
        ``origins``: their ``DOC_ORIGIN`` rows (needed with ``provenance``)."""
        counts = self.weights(lengths, None)
        if self.provenance:
            origins = check_batch(origins, len(counts))
        ids, mask = split_units(np.frombuffer(payload, dtype=self.unit))
        if mask is not None:
            payload = memoryview(ids).cast("B")
        if self.nanogpt:  # nanoGPT reads uint16, whatever the shards' dtype
            if self._flat is None:
                self._flat = _FlatPiece(out_dir=self.out_dir, split=self.split, part=self.part)
            self._flat.write(payload if self.dtype == np.uint16 else ids.astype(np.uint16).tobytes())
        starts = starts_of(counts)
        size = self.dtype.itemsize
        for a, b, new in runs(self._roller.cut(counts), len(counts)):
            if new:
                self._roll()
            if self._bin is None:
                self._bin = HashingFile(self.out_dir / self.shard_name(self.next_index()))
                if mask is not None:
                    self._mask = MaskFile(self.out_dir / self.shard_name(self.next_index(), MASK_SUFFIX))
            self._bin.write(payload[int(starts[a]) * size:int(starts[b]) * size])
            if self._mask is not None and mask is not None:
                self._mask.write(mask[int(starts[a]):int(starts[b])])
            self._lengths.append(counts[a:b])
            if origins is not None and self.provenance:
                self._origins.append(np.array(origins[a:b]))  # a copy: the batch's buffers are reused

    def _roll(self) -> None:
        assert self._bin is not None
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int64)
        name = self._bin.path.name
        sha = self._bin.commit()
        idx = HashingFile(self.out_dir / self.shard_name(self.next_index(), ".idx"))
        idx.write(idx_bytes(lengths, self.dtype))
        idx_sha = idx.commit()
        extra: dict[str, Any] = {"tokens": int(lengths.sum()),
                                 "index": {"path": idx.path.name, "bytes": idx.bytes, "sha256": idx_sha}}
        if self.provenance:
            path = self.out_dir / self.shard_name(self.next_index(), ORIGINS_SUFFIX)
            extra["origins"] = write_origins(path, self._origins)
        if self._mask is not None:
            extra["mask"] = self._mask.commit()
        self.shards.append(ShardRecord(path=name, samples=len(lengths), bytes=self._bin.bytes, sha256=sha,
                                       extra=extra))
        self._bin, self._lengths, self._origins, self._mask = None, [], [], None

    def shard_full(self) -> None:
        if self._bin is not None:
            self._roll()
        self._roller = self.rollover()  # an empty shard: the next sample opens one

    def close(self) -> list[ShardRecord]:
        if self._bin is not None:
            self._roll()
        if self.nanogpt and self._flat is None and self.part.whole:  # an empty split: an empty file
            self._flat = _FlatPiece(out_dir=self.out_dir, split=self.split, part=self.part)
        if self._flat is not None:
            self.flat_record = self._flat.close()
        return self.shards

    def piece(self) -> dict[str, Any]:
        """Its shards, and its part of the nanoGPT file (``flat``, which ``finish_split`` reads): the
        whole file (vouched for as one of its ``files``), or a stretch of the scratch file the ranges fill."""
        flat, vouched = self.flat_record, {}
        if flat is not None and "path" in flat:
            vouched["files"] = [flat]
        elif flat is not None:
            vouched["stretches"] = [{"scratch": flat_scratch_name(self.split),
                                     "path": nanogpt_name(self.split),
                                     "end": int(flat["offset"]) + 2 * int(flat["tokens"])}]
        return {**super().piece(), "flat": flat, **vouched}

    @property
    def shards_alone(self) -> bool:
        """Not with ``--nanogpt``: the split-wide ``train.bin`` is written in pieces of whole ranges."""
        return not self.nanogpt

    def shard_piece(self, i: int) -> dict[str, Any] | None:
        """One finished shard alone, so the gather gives back the spill it read (``engine/shuffle/release.py``)."""
        return {**self.one_shard(i), "flat": None} if self.shards_alone else None

    def finish_split(self, pieces: list[dict[str, Any]]) -> dict[str, Any]:
        """The nanoGPT file: the one whole writer's, or the scratch file the ranges filled, hashed and moved."""
        if not self.nanogpt:
            return {}
        flats = [p["flat"] for p in pieces if p.get("flat")]
        if len(flats) == 1 and "sha256" in flats[0]:
            self.flat_record = flats[0]
            return {"flat": self.flat_record}
        assert self.part.work_dir is not None
        scratch = flat_scratch(self.part.work_dir, self.split)
        size = 2 * sum(int(f["tokens"]) for f in flats)
        target = self.out_dir / nanogpt_name(self.split)
        if not scratch.exists() and target.is_file() and target.stat().st_size == size:
            scratch = target  # moved by a finalize that was killed before the manifest
        with naming(scratch), open(scratch, "ab+") as fh:  # created empty for a split with no tokens
            if os.fstat(fh.fileno()).st_size != size:
                raise DatasetError(f"{scratch}: {os.fstat(fh.fileno()).st_size} bytes, the gather ranks "
                                   f"wrote {size}: rerun the gather")
            os.fsync(fh.fileno())
            sha = file_sha256(fh.fileno(), size)
        if scratch != target:
            os.replace(scratch, target)
            fsync_dir(self.out_dir)
        self.flat_record = {"path": target.name, "bytes": size, "sha256": sha, "dtype": "uint16"}
        return {"flat": self.flat_record}

    def abort(self) -> None:
        for f in (self._bin, self._flat, self._mask):
            if f is not None:
                f.abort()
