"""Reading packed token datasets (``pack-tokens --pack best-fit``): sequence i as ``tokens`` (seq_len
ids, padded at the end), ``cu_seqlens`` (int32: 0, the end of each document piece; the last entry
is the number of real tokens), ``position_ids`` (restarting at each piece) and, for a chat dataset,
``loss_mask``; ``varlen_batch`` joins a batch of them into one flat ``cu_seqlens`` with ``labels``
(what ``shardsmith.torch.PackedBatches`` yields)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shardsmith.errors import DatasetError
from shardsmith.formats.tokens.boundaries import read_boundaries
from shardsmith.formats.tokens.dataset import _TokenShards
from shardsmith.formats.tokens.kinds import tokenizer_of
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.sample_kind import ListForm, SampleKind


def packing_stats(extras: list[dict[str, Any]], *, seq_len: int) -> dict[str, Any]:
    """The manifest's packing figures from the shards' records."""
    tokens = sum(int(e["tokens"]) for e in extras)
    real = sum(int(e["real_tokens"]) for e in extras)
    docs = sum(int(e["documents"]) for e in extras)
    split = sum(int(e["documents_split"]) for e in extras)
    return {"sequences": tokens // seq_len, "real_tokens": real, "padding_tokens": tokens - real,
            "padding_fraction": round((tokens - real) / tokens, 6) if tokens else 0.0,
            "documents": docs, "documents_split": split,
            "split_fraction": round(split / docs, 6) if docs else 0.0}


IGNORE_INDEX = -100  # a label the loss skips (PyTorch's cross_entropy and HF models' default ignore_index)


def positions(cu: np.ndarray, n: int) -> np.ndarray:
    """Each of ``n`` tokens' position inside its segment (``cu``: 0, the segments' ends; the tail
    after the last end is one more segment)."""
    ends = np.append(cu[1:], n) if (len(cu) < 2 or cu[-1] < n) else cu[1:]
    starts = np.concatenate([[0], ends[:-1]])
    return np.arange(n, dtype=np.int64) - np.repeat(starts, ends - starts)


def varlen_batch(items: list[dict[str, np.ndarray]], *, seq_len: int) -> dict[str, Any]:
    """Packed sequences (``ds[i]`` items) as one batch for varlen attention over ``tokens.reshape(-1)``.

    ``tokens`` int64 (B, seq_len); ``cu_seqlens`` int32, flat over the batch as flash-attn's
    ``flash_attn_varlen_func`` takes it: row j's document ends plus ``j·seq_len``, then its padding
    tail as one segment of its own (so padding never joins the next row's first document), the last
    entry ``B·seq_len``; ``max_seqlen`` the longest segment; ``real`` int32 (B,) the real tokens of
    each row (``tokens[j, real[j]:]`` is padding: mask it out of the loss); ``position_ids`` int64
    (B, seq_len), restarting at 0 at every segment (what HF models take for packed rows);
    ``loss_mask`` bool (B, seq_len): the tokens the loss counts (a chat item's own mask; every real
    token of an item without one, as in a mixture with pre-training data); ``labels`` int64
    (B, seq_len): ``tokens`` where the loss counts them, ``IGNORE_INDEX`` elsewhere and at the first
    token of every segment, so that no token is predicted across a packed boundary (unshifted, as HF
    models take ``labels``: the loss compares the logits at t with the label at t + 1).
    """
    rows = len(items)
    if rows * seq_len >= 1 << 31:
        raise ValueError(f"a batch of {rows} x {seq_len} tokens: cu_seqlens are int32, keep it under 2**31")
    tokens = np.stack([it["tokens"] for it in items]) if rows else np.zeros((0, seq_len), np.int64)
    real = np.array([int(it["cu_seqlens"][-1]) for it in items], dtype=np.int32)
    ends: list[np.ndarray] = [np.zeros(1, np.int64)]
    for j, it in enumerate(items):
        ends.append(it["cu_seqlens"][1:].astype(np.int64) + j * seq_len)
        if real[j] < seq_len:
            ends.append(np.array([(j + 1) * seq_len], np.int64))
    cu = np.concatenate(ends)
    lengths = np.diff(cu)
    pos = np.arange(rows * seq_len, dtype=np.int64) - np.repeat(cu[:-1], lengths)
    real_token = np.arange(seq_len)[None, :] < real[:, None]
    mask = np.stack([np.asarray(it["loss_mask"], dtype=bool) if "loss_mask" in it else real_token[j]
                     for j, it in enumerate(items)]) if rows else np.zeros((0, seq_len), bool)
    mask = mask & real_token
    labels = np.where(mask & (pos.reshape(rows, seq_len) > 0), tokens, IGNORE_INDEX)
    return {"tokens": tokens, "cu_seqlens": cu.astype(np.int32), "max_seqlen": int(lengths.max(initial=0)),
            "real": real, "position_ids": pos.reshape(rows, seq_len), "loss_mask": mask, "labels": labels}


class PackedSequences(Dataset):
    """The packed sequences of one split: ``ds[i] -> {"tokens": int64[seq_len], "cu_seqlens": int32[k+1],
    "position_ids": int64[seq_len]}``, with ``"loss_mask": bool[seq_len]`` for a chat dataset."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train",
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None) -> None:
        self._shards = _TokenShards(out_dir, split, cache_dir=cache_dir, cache_limit=cache_limit)
        self.manifest = self._shards.manifest
        packing = self.manifest.get("packing")
        if not isinstance(packing, dict):
            raise DatasetError(f"{self._shards.out_dir}: not a packed dataset (no 'packing' in the manifest)")
        self.seq_len = int(packing["seq_len"])
        self.pad_id = int(packing["pad_id"])
        self.split = split
        self._ends = self._boundaries()

    def _boundaries(self) -> np.ndarray:
        """Every document piece's end in the split's token stream (from each shard's .cu.npy)."""
        files = self._shards._files
        parts = []
        for entry, start in zip(self._shards.entries, self._shards.starts[:-1].tolist()):
            cu = entry.get("boundaries")
            if not isinstance(cu, dict):
                raise DatasetError(f"{entry['path']}: the manifest names no document boundaries for it")
            tokens = entry["bytes"] // self._shards.dtype.itemsize
            if tokens % self.seq_len:
                raise DatasetError(f"{files.name_of(cu['path'])}: its shard holds {tokens} tokens, not whole "
                                   f"sequences of {self.seq_len}")
            ends = read_boundaries(files, cu, tokens=tokens)  # read now, whole (through the cache for a URL)
            parts.append(ends + start)
        self._pieces = [len(p) for p in parts]  # per shard: what its origins hold a row for
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return self._shards.tokens // self.seq_len

    def _check(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sequence {i} out of range for {n} sequences")
        return i % n

    def cu_seqlens(self, i: int) -> np.ndarray:
        start = self._check(int(i)) * self.seq_len
        lo, hi = np.searchsorted(self._ends, [start, start + self.seq_len], side="right")
        return np.concatenate([[0], self._ends[lo:hi] - start]).astype(np.int32)

    def sources(self, i: int) -> list[dict[str, Any]]:
        """The document pieces sequence i holds, in order, as ``TokenDataset.sources`` gives them
        (``start``/``stop``: the piece's tokens in the sequence, as ``cu_seqlens`` bounds them; a
        document longer than the sequence is one piece in each of several sequences)."""
        start = self._check(int(i)) * self.seq_len
        lo, hi = np.searchsorted(self._ends, [start, start + self.seq_len], side="right")
        cu = self.cu_seqlens(i).tolist()
        spans = list(zip(cu[:-1], cu[1:]))
        return self._shards.sources(np.arange(lo, hi), spans, self._pieces)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        i = self._check(int(i))
        tokens = self._shards._span(i * self.seq_len, self.seq_len).astype(np.int64)
        cu = self.cu_seqlens(i)
        item = {"tokens": tokens, "cu_seqlens": cu, "position_ids": positions(cu, self.seq_len)}
        if self._shards.chat:
            item["loss_mask"] = self._shards.loss_mask(i * self.seq_len, self.seq_len)
        return item

    @property
    def kind(self) -> SampleKind:
        return SampleKind("packed sequences", ListForm(), (("seq_len", self.seq_len), ("pad_id", self.pad_id),
                                                          ("tokenizer", tokenizer_of(self.manifest))))

    def read(self, indices: Any) -> list[dict[str, np.ndarray]]:
        return [self[int(i)] for i in np.asarray(indices).reshape(-1)]

    get_batch = read

    def get_varlen(self, indices: Any) -> dict[str, Any]:
        """Sequences ``indices`` as one varlen batch (``varlen_batch``: flat ``cu_seqlens``)."""
        return varlen_batch(self.get_batch(indices), seq_len=self.seq_len)
