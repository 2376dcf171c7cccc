"""Megatron-compatible indexed datasets: ``{split}-{000000}.bin`` + ``.idx`` (``MMIDIDX``), one
sequence per document, plus an optional flat nanoGPT ``{split}.bin``.

The .idx layout (Megatron-LM ``megatron/core/datasets/indexed_dataset.py``): magic
``MMIDIDX\\x00\\x00``, u64 version 1, u8 dtype code, u64 sequence count S, u64 document count S+1,
int32 sequence lengths[S], int64 byte pointers[S], int64 document indices[S+1] = 0..S.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from shardsmith.fsutil import HashingFile
from shardsmith.writers.base import ShardRecord, Writer

IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_VERSION = 1
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16}
CODE_OF = {np.dtype(v).name: k for k, v in DTYPE_CODES.items()}


def token_dtype(vocab_size: int) -> np.dtype:
    """Megatron's choice: uint16 below a vocabulary of 65500, else int32."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


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


class TokensWriter(Writer):
    """Writes one split's documents (token arrays in ``dtype``) into rolling Megatron shards."""

    name = "tokens"
    suffix = ".bin"

    def __init__(self, *, out_dir: Path, split: str, dtype: np.dtype, shard_tokens: int,
                 nanogpt: bool = False) -> None:
        super().__init__(out_dir=out_dir, split=split)
        self.dtype = np.dtype(dtype)
        self.shard_tokens = shard_tokens
        self._bin: HashingFile | None = None
        self._lengths: list[np.ndarray] = []
        self._tokens = 0
        self._flat = HashingFile(self.out_dir / f"{split}.bin") if nanogpt else None
        self.flat_record: dict | None = None

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        """Append documents (lengths in bytes, payload back to back), rolling over at ``shard_tokens``."""
        counts = np.asarray(lengths, dtype=np.int64) // self.dtype.itemsize
        if self._flat is not None:  # nanoGPT reads uint16, whatever the shards' dtype
            flat = np.frombuffer(payload, dtype=self.dtype)
            self._flat.write(payload if self.dtype == np.uint16 else flat.astype(np.uint16).tobytes())
        ends = np.cumsum(counts)
        done_docs, done_tokens = 0, 0
        while done_docs < len(counts):
            if self._bin is None:
                self._bin = HashingFile(self.out_dir / self.shard_name(len(self.shards)))
            room = self.shard_tokens - self._tokens
            fit = int(np.searchsorted(ends[done_docs:] - done_tokens, room, side="right"))
            if fit == 0 and self._tokens == 0:
                fit = 1  # a document longer than a shard gets a shard of its own
            if fit:
                stop_tokens = int(ends[done_docs + fit - 1])
                self._bin.write(payload[done_tokens * self.dtype.itemsize: stop_tokens * self.dtype.itemsize])
                self._lengths.append(counts[done_docs: done_docs + fit])
                self._tokens += stop_tokens - done_tokens
                done_docs += fit
                done_tokens = stop_tokens
            if done_docs < len(counts):
                self._roll()

    def _roll(self) -> None:
        assert self._bin is not None
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int64)
        name = self._bin.path.name
        sha = self._bin.commit()
        idx = HashingFile(self.out_dir / self.shard_name(len(self.shards), ".idx"))
        idx.write(idx_bytes(lengths, self.dtype))
        idx_sha = idx.commit()
        self.shards.append(ShardRecord(
            path=name, samples=len(lengths), bytes=self._bin.bytes, sha256=sha,
            extra={"tokens": int(lengths.sum()),
                   "index": {"path": idx.path.name, "bytes": idx.bytes, "sha256": idx_sha}},
        ))
        self._bin, self._lengths, self._tokens = None, [], 0

    def close(self) -> list[ShardRecord]:
        if self._bin is not None:
            self._roll()
        if self._flat is not None:
            sha = self._flat.commit()
            self.flat_record = {"path": self._flat.path.name, "bytes": self._flat.bytes, "sha256": sha,
                                "dtype": "uint16"}
        return self.shards

    def abort(self) -> None:
        for f in (self._bin, self._flat):
            if f is not None:
                f.abort()
