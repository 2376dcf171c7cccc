"""Best-fit decreasing packing of documents into fixed-length sequences, over a bounded window.

Documents arrive in the run's (shuffled) order. They collect in a window until it holds
``window_tokens`` tokens (the window closes after the document that reaches it); the window is
then packed and handed out, and the next one starts empty, so the packer never holds more than
``window_tokens`` plus one document (``--pack-window``: an option of its own, so the sequences never
depend on ``--memory`` or ``--workers``). A document longer than ``seq_len`` is cut into
``seq_len``-token pieces (the last one shorter). Inside a window the pieces are placed largest
first, each into the open sequence whose free space is the smallest that still fits it (best fit),
or into a new sequence. Sequences leave in the order they were opened, and the pieces inside one
sequence keep their order in the stream: the pieces of a split document therefore appear in order
(full pieces open their own sequences before any shorter piece is placed). Everything depends only
on the documents in order, never on the batches they came in.

The placement is a loop over pieces (bisect on a sorted list of free spaces); copying tokens into
sequences is one slice copy per piece, and every count is vectorized (``Window.block``).

The run's side (``pack-tokens --pack best-fit --seq-len N``; ``packed_writer.py``, ``packed.py``).
megatron-core's ``IndexedDataset`` reads entry i as sequence i, padding included (tested);
Megatron's own ``GPTDataset`` would treat each sequence as one document. Packing happens in the
gather, where the documents come out in their final order, one writer a split, so the bytes do not
depend on ``--workers``, cluster ranks, or a kill and resume. ``window_tokens`` = ``--pack-window``
(default 4M tokens, ``DEFAULT_WINDOW_TOKENS``), recorded in the manifest. The window's tokens stay
within an eighth of ``--memory`` plus one document (held as views of the gather's batches, copied
once into one array when the window is packed: about a quarter of ``--memory`` at that moment; the
sequences then leave in blocks of 1M tokens): a ``--memory`` under 8 × 4 bytes (int32, the widest
token) per window token is refused with one line naming ``--memory`` and ``--pack-window``, as is a
window of fewer than 8 sequences of N. The default keeps padding at 2048 at 0.10 % on the bench
corpus (0.19 % at 1M, 0.06 % for one window over all its 11M tokens; ``bench/bench_pack.py``).
Documents never cross a window, so the shuffle is kept at the window's scale. Each piece counts as
one document in ``cu_seqlens``; the manifest counts a document once in ``documents_split``.

The pad id: ``--pad-id``, else the tokenizer's padding token (its ``padding`` setting), else the
first of ``<pad>``, ``[PAD]``, ``<|pad|>``, ``<|padding|>``, ``<|endoftext|>`` among its special
tokens, else the eos id; a run with none of them is refused. ``--pad-id`` outside the vocabulary,
``--pad-id`` or ``--pack-window`` without ``--pack``, ``--pack`` without ``--seq-len``, and ``--pack``
with ``--nanogpt`` are usage errors.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.core.ragged import starts_of

_KEY = 1 << 32  # a free-space key: free * _KEY + sequence number (best fit, then the oldest sequence)
BLOCK_TOKENS = 1 << 20  # tokens per block of sequences handed to the writer


def best_fit(lengths: list[int], seq_len: int) -> list[int]:
    """The sequence of each item under best-fit decreasing, sequences numbered in opening order."""
    order = np.lexsort((np.arange(len(lengths)), -np.asarray(lengths, dtype=np.int64))).tolist()
    seq = [0] * len(lengths)
    opened = 0
    free: list[int] = []  # keys of sequences with free space, ascending
    for i in order:
        n = lengths[i]
        at = bisect_left(free, n * _KEY)
        if at < len(free):
            key = free.pop(at)
            b, left = key % _KEY, key // _KEY - n
        else:
            b, left = opened, seq_len - n
            opened += 1
        seq[i] = b
        if left:
            insort(free, left * _KEY + b)
    return seq


@dataclass(frozen=True)
class Block:
    """Packed sequences ``rows`` (k, seq_len) with the end of every piece (row-major positions,
    increasing), and per row: real tokens, documents that begin there, and those of them cut;
    ``origins``: each piece's document's origin row, in the order of ``ends`` (with provenance)."""

    rows: np.ndarray
    ends: np.ndarray
    real: np.ndarray
    documents: np.ndarray
    split: np.ndarray
    origins: np.ndarray | None = None


class Window:
    """One packed window: its tokens in stream order and where each piece goes (``origins``: one
    row per document, carried to its pieces as placed)."""

    def __init__(self, tokens: np.ndarray, doc_lengths: np.ndarray, seq_len: int,
                 origins: np.ndarray | None = None) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        counts = -(-doc_lengths // seq_len)  # pieces per document
        first = starts_of(counts)[:-1]
        n = int(counts.sum())
        lengths = np.full(n, seq_len, dtype=np.int64)
        last = first + counts - 1
        lengths[last] = doc_lengths - (counts - 1) * seq_len
        is_first = np.zeros(n, dtype=bool)
        is_first[first] = True
        cut = np.repeat(doc_lengths > seq_len, counts)
        src = starts_of(lengths)[:-1]
        seq = np.asarray(best_fit(lengths.tolist(), seq_len), dtype=np.int64)
        order = np.lexsort((np.arange(n), seq))  # by sequence, then stream order
        self.seq, self.len, self.src = seq[order], lengths[order], src[order]
        self.first, self.cut_first = is_first[order], (is_first & cut)[order]
        self.origins = None if origins is None else origins[np.repeat(np.arange(len(counts)), counts)[order]]
        group_start = np.searchsorted(self.seq, self.seq, side="left")
        within = starts_of(self.len)[:-1]
        self.dst = within - within[group_start]  # offset of each piece inside its sequence
        self.sequences = int(self.seq[-1]) + 1 if n else 0
        self.empty = 0

    def block(self, r0: int, r1: int, *, pad: Any, dtype: np.dtype) -> Block:
        """Sequences ``[r0, r1)`` of this window, padded with ``pad`` (a value of ``dtype``)."""
        n = self.seq_len
        a, b = np.searchsorted(self.seq, [r0, r1], side="left")
        ln = self.len[a:b]
        dst = (self.seq[a:b] - r0) * n + self.dst[a:b]
        rows = np.full((r1 - r0) * n, pad, dtype=dtype)
        tokens = self.tokens
        for d, s, m in zip(dst.tolist(), self.src[a:b].tolist(), ln.tolist()):  # pieces are long: a copy each
            rows[d:d + m] = tokens[s:s + m]
        row = self.seq[a:b] - r0
        per_row = {name: np.bincount(row, weights=w, minlength=r1 - r0).astype(np.int64)
                   for name, w in (("real", ln), ("documents", self.first[a:b]), ("split", self.cut_first[a:b]))}
        origins = None if self.origins is None else self.origins[a:b]
        return Block(rows=rows.reshape(r1 - r0, n), ends=dst + ln, origins=origins, **per_row)

    def blocks(self, *, pad: Any, dtype: np.dtype) -> Iterator[Block]:
        step = max(1, BLOCK_TOKENS // self.seq_len)
        for r0 in range(0, self.sequences, step):
            yield self.block(r0, min(self.sequences, r0 + step), pad=pad, dtype=dtype)

    def pieces(self) -> list[list[np.ndarray]]:
        """Each sequence's pieces (for tests and small tools)."""
        out: list[list[np.ndarray]] = [[] for _ in range(self.sequences)]
        for s, src, ln in zip(self.seq.tolist(), self.src.tolist(), self.len.tolist()):
            out[s].append(self.tokens[src:src + ln])
        return out


class BestFitPacker:
    """Feed documents with ``add_batch`` (windows come out as they fill), then ``finish``."""

    def __init__(self, *, seq_len: int, window_tokens: int) -> None:
        if not 1 <= seq_len < _KEY:
            raise ValueError(f"seq_len {seq_len} out of range")
        self.seq_len = seq_len
        self.window_tokens = max(int(window_tokens), seq_len)
        self._tokens: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._origins: list[np.ndarray] = []
        self._held = 0
        self.peak_tokens = 0  # the most tokens a window held (tests check the bound)

    def add_batch(self, lengths: np.ndarray, tokens: np.ndarray, origins: np.ndarray | None = None
                  ) -> Iterator[Window]:
        """Documents back to back in ``tokens`` with these lengths (views kept until their window is
        packed: the caller must not reuse the buffer, as ``Writer.keeps_batches`` promises), and
        their origin rows (given with every batch, or never)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        starts = starts_of(lengths)
        at = 0
        while at < len(lengths):
            reach = self._held + starts[at + 1:] - starts[at]
            stop = at + int(np.searchsorted(reach, self.window_tokens, side="left")) + 1  # the doc that reaches it
            stop = min(stop, len(lengths))
            self._tokens.append(tokens[starts[at]:starts[stop]])
            self._lengths.append(lengths[at:stop])
            if origins is not None:
                self._origins.append(origins[at:stop])
            self._held += int(starts[stop] - starts[at])
            at = stop
            if self._held >= self.window_tokens:
                yield self._flush()

    def finish(self) -> Iterator[Window]:
        if self._lengths:
            yield self._flush()

    def _flush(self) -> Window:
        tokens = np.concatenate(self._tokens)
        lengths = np.concatenate(self._lengths)
        origins = np.concatenate(self._origins)[lengths > 0] if self._origins else None
        assert origins is None or len(origins) == int((lengths > 0).sum()), "origins given for some batches only"
        self.peak_tokens = max(self.peak_tokens, self._held)
        self._tokens, self._lengths, self._origins, self._held = [], [], [], 0
        window = Window(tokens, lengths[lengths > 0], self.seq_len, origins=origins)
        window.empty = int((lengths == 0).sum())  # empty documents: counted, never placed
        return window


DEFAULT_WINDOW_TOKENS = 4_000_000  # --pack-window: padding 0.10 % at 2048 on the bench corpus (bench_pack.py)
MIN_SEQUENCES = 8  # a window holds at least this many sequences
TOKEN_BYTES = 4  # the widest token dtype (int32): what --memory must hold per window token


def window_bytes(window_tokens: int, *, chat: bool = False) -> int:
    """The ``--memory`` a window of ``window_tokens`` needs: the window is an eighth of it at most
    (views of the gather's batches, then one copy while it is packed); a chat token carries its loss
    byte too (``masks.unit_dtype``)."""
    return 8 * (TOKEN_BYTES + int(chat)) * window_tokens
