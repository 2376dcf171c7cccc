"""The best-fit packer alone (hypothesis): every token of every document once and in order, no
sequence over seq_len, boundaries where the documents end, the window's memory bounded."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.formats.tokens.packing import BestFitPacker, best_fit

docs_st = st.lists(st.integers(1, 120), min_size=0, max_size=80)


def _run(lengths: list[int], seq_len: int, window: int):
    docs = []
    base = 0
    for n in lengths:  # document d is ids base..base+n: every token is unique and says where it came from
        docs.append(np.arange(base, base + n, dtype=np.int64))
        base += n
    packer = BestFitPacker(seq_len=seq_len, window_tokens=window)
    out = []
    for d in docs:
        out.extend(packer.add(d))
    out.extend(packer.finish())
    return docs, out, packer


@settings(max_examples=200, deadline=None)
@given(docs_st, st.integers(1, 64), st.integers(1, 600))
def test_every_token_once_in_order_and_no_sequence_over_seq_len(lengths, seq_len, window):
    docs, out, packer = _run(lengths, seq_len, window)
    pieces = [p for seq in out for p in seq.pieces]
    assert all(sum(len(p) for p in seq.pieces) <= seq_len for seq in out)
    assert all(len(seq.pieces) >= 1 for seq in out)
    flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    # every token exactly once
    assert sorted(flat.tolist()) == list(range(sum(lengths)))
    # each piece is a contiguous run of one document, and a document's pieces come in order
    where = {}
    for k, p in enumerate(pieces):
        assert np.array_equal(p, np.arange(p[0], p[0] + len(p)))
        where[int(p[0])] = k
    for d in docs:
        starts = [int(s) for s in range(int(d[0]), int(d[0]) + len(d), seq_len)]
        positions = [where[s] for s in starts]
        assert positions == sorted(positions)
    # counts for the manifest
    assert sum(s.starts for s in out) == len(lengths)
    assert sum(s.split for s in out) == sum(n > seq_len for n in lengths)
    # bounded memory: the window never held more than its size plus one document
    assert packer.peak_tokens <= max(window, seq_len) + max(lengths, default=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=60), st.integers(50, 64))
def test_best_fit_fills_no_worse_than_first_fit_bound(lengths, seq_len):
    bins = best_fit(lengths, seq_len)
    # any two bins together hold more than seq_len: no two could have been merged (a best-fit property)
    fills = sorted(sum(lengths[i] for i in b) for b in bins)
    if len(fills) >= 2:
        assert fills[0] + fills[1] > seq_len
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(b == sorted(b) for b in bins)


def test_packs_tightly_with_many_small_documents():
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 900, size=5000).tolist()
    _, out, _ = _run(lengths, 2048, 1 << 20)
    real = sum(s.real for s in out)
    assert 1 - real / (len(out) * 2048) < 0.01


def test_window_bounds_are_independent_of_batches():
    lengths = [5, 40, 13, 64, 90, 7, 3, 33] * 20
    _, a, _ = _run(lengths, 64, 200)
    _, b, _ = _run(lengths, 64, 200)
    assert [[p.tolist() for p in s.pieces] for s in a] == [[p.tolist() for p in s.pieces] for s in b]
