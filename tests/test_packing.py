"""The best-fit packer alone (hypothesis): every token of every document once and in order, no
sequence over seq_len, boundaries where the pieces end, the window's memory bounded, and the same
sequences whatever batches the documents come in."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.formats.tokens.packing import BestFitPacker, best_fit


def _run(lengths: list[int], seq_len: int, window: int, cuts: list[int] = ()):
    """Document d holds unique ids (its tokens say where they came from), fed in batches cut at ``cuts``."""
    tokens = np.arange(sum(lengths), dtype=np.int64)
    packer = BestFitPacker(seq_len=seq_len, window_tokens=window)
    bounds = sorted({0, len(lengths), *(c % (len(lengths) + 1) for c in cuts)})
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    windows = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        windows += packer.add_batch(np.asarray(lengths[a:b], dtype=np.int64), tokens[starts[a]:starts[b]])
    windows += packer.finish()
    return starts, windows, packer


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 120), max_size=80), st.integers(1, 64), st.integers(1, 600),
       st.lists(st.integers(0, 80), max_size=5))
def test_every_token_once_in_order_no_sequence_over_seq_len(lengths, seq_len, window, cuts):
    starts, windows, packer = _run(lengths, seq_len, window, cuts)
    seqs = [s for w in windows for s in w.pieces()]
    assert all(0 < sum(len(p) for p in s) <= seq_len for s in seqs)
    pieces = [p for s in seqs for p in s]
    flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    assert sorted(flat.tolist()) == list(range(sum(lengths)))  # every token exactly once
    where = {}
    for k, p in enumerate(pieces):  # a piece is a contiguous run of one document
        assert np.array_equal(p, np.arange(p[0], p[0] + len(p)))
        assert np.searchsorted(starts, p[0], side="right") == np.searchsorted(starts, p[-1], side="right")
        where[int(p[0])] = k
    for d, n in enumerate(lengths):  # a document's pieces come in order, seq_len long but the last
        at = [where[int(s)] for s in range(int(starts[d]), int(starts[d]) + n, seq_len)]
        assert at == sorted(at)
    for seq in seqs:  # inside a sequence, stream order
        assert [int(p[0]) for p in seq] == sorted(int(p[0]) for p in seq)
    # the blocks the writer writes: rows = pieces then padding, ends where pieces end, counts
    rows, ends, real, docs, split, base = [], [], 0, 0, 0, 0
    for w in windows:
        for b in w.blocks(pad=-1, dtype=np.dtype(np.int64)):
            rows += list(b.rows)
            ends += (b.ends + base).tolist()
            base += b.rows.size
            real, docs, split = real + b.real.sum(), docs + b.documents.sum(), split + b.split.sum()
    assert len(rows) == len(seqs)
    want_ends = []
    for i, (row, seq) in enumerate(zip(rows, seqs)):
        body = np.concatenate(seq)
        assert np.array_equal(row[:len(body)], body) and (row[len(body):] == -1).all()
        want_ends += (i * seq_len + np.cumsum([len(p) for p in seq])).tolist()
    assert ends == want_ends
    assert real == sum(lengths) and docs + sum(w.empty for w in windows) == len(lengths)
    assert split == sum(n > seq_len for n in lengths)
    # bounded memory: a window never held more than its size plus one document
    assert packer.peak_tokens <= max(window, seq_len) + max(lengths, default=0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 120), min_size=1, max_size=60), st.integers(1, 64), st.integers(1, 600),
       st.lists(st.integers(0, 60), max_size=5))
def test_the_same_sequences_whatever_the_batches(lengths, seq_len, window, cuts):
    _, one, _ = _run(lengths, seq_len, window)
    _, many, _ = _run(lengths, seq_len, window, cuts)
    as_lists = [[[p.tolist() for p in s] for s in w.pieces()] for w in one]
    assert as_lists == [[[p.tolist() for p in s] for s in w.pieces()] for w in many]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=60), st.integers(50, 64))
def test_no_two_sequences_could_be_merged(lengths, seq_len):
    seq = best_fit(lengths, seq_len)
    fills = sorted(np.bincount(seq, weights=lengths).tolist())
    if len(fills) >= 2:
        assert fills[0] + fills[1] > seq_len


def test_packs_tightly_with_many_small_documents():
    lengths = np.random.default_rng(0).integers(20, 900, size=5000).tolist()
    _, windows, _ = _run(lengths, 2048, 1 << 20)
    sequences = sum(w.sequences for w in windows)
    assert 1 - sum(lengths) / (sequences * 2048) < 0.01
