"""text/ngrams: word n-gram hashes equal a plain Python statement of their definition, a short text's
one hash is the hash of the same words met as a window elsewhere (decontamination matches short
items whole), and the hashes are the same in another process."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.errors import UsageError
from shardsmith.text import ngrams
from shardsmith.text.ngrams import word_ngram_hashes
from shardsmith.text.textnorm import normalize

M64 = (1 << 64) - 1
# the definition's constants, written out: changing one changes every stored signature
P, Q, L = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93, 0xC2B2AE3D27D4EB4F


def mix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def poly(xs: list[int], base: int) -> int:
    return sum(x * pow(base, j, 1 << 64) for j, x in enumerate(xs)) & M64


def word_hash(w: str) -> int:
    b = w.encode("utf-8", "surrogatepass")
    return mix((poly([c + 1 for c in b], P) + len(b) * L) & M64)


def seq_hash(words: list[str]) -> int:
    return mix((poly([word_hash(w) for w in words], Q) + len(words) * L) & M64)


def reference(texts: list[str], n: int) -> list[list[int]]:
    out = []
    for t in texts:
        w = [x for x in normalize(t).split(" ") if x]
        if len(w) >= n:
            out.append([seq_hash(w[i:i + n]) for i in range(len(w) - n + 1)])
        else:
            out.append([seq_hash(w)] if w else [])
    return out


def rows(texts: list[str], n: int, **kw) -> list[list[int]]:
    h, off = word_ngram_hashes(texts, n, **kw)
    assert h.dtype == np.uint64 and off.dtype == np.int64 and len(off) == len(texts) + 1
    assert off[0] == 0 and off[-1] == len(h) and (np.diff(off) >= 0).all()
    return [[int(v) for v in h[off[i]:off[i + 1]]] for i in range(len(texts))]


WORDS = ["a", "b", "the", "Fox", "café", "CAFÉ", "東京", "🙂", "ß", "ﬁ", "x\u0301", "\ud800", "", "Ω", "1,5"]
SPACES = [" ", "  ", "\t", "\n", "\u00a0", "\u3000", "\u2029"]


@st.composite
def text(draw) -> str:
    words = draw(st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=6)), max_size=25))
    seps = draw(st.lists(st.sampled_from(SPACES), min_size=len(words) + 1, max_size=len(words) + 1))
    return "".join(s + w for s, w in zip(seps, words)) + seps[-1]


@settings(max_examples=150, deadline=None)
@given(st.lists(text(), max_size=8), st.integers(1, 14))
def test_matches_the_python_reference(texts: list[str], n: int) -> None:
    assert rows(texts, n) == reference(texts, n)
    assert rows([normalize(t) for t in texts], n, normalized=True) == reference(texts, n)


@settings(max_examples=100, deadline=None)
@given(text(), st.integers(0, 30), st.integers(1, 13), st.integers(0, 30), st.integers(2, 13))
def test_a_short_item_matches_whole_where_its_words_appear(item_text: str, before: int, k_cut: int, after: int,
                                                          n: int) -> None:
    words = [w for w in normalize(item_text).split(" ") if w][:max(1, min(k_cut, n - 1))]
    if not words:
        words = ["solo"]
    item = " ".join(words)
    doc = " ".join(["pad"] * before + words + ["tail"] * after)
    (h_item,) = rows([item], n)
    assert len(h_item) == 1
    assert h_item[0] in rows([doc], len(words))[0]
    if before + len(words) + after >= n:  # the length is in the hash: no n-word window equals it
        assert h_item[0] not in rows([doc], n)[0]


def test_edges() -> None:
    assert rows([], 5) == []
    assert rows(["", "   ", "one"], 5) == [[], [], [seq_hash(["one"])]]
    assert rows(["Hello,\u00a0 WORLD\n"], 2) == rows(["hello, world"], 2)
    # the same 5-gram in two texts and at two places of one text: the same hash
    a, b = rows(["q w e r t y", "zz q w e r t"], 5)
    assert a[0] == b[1] and a[0] != a[1]
    with pytest.raises(UsageError):
        word_ngram_hashes(["a"], 0)


def test_large_batches_span_many_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [" ".join(f"w{(i * 7 + j) % 50}" for j in range(i % 40)) for i in range(300)]
    whole = rows(texts, 5)
    monkeypatch.setattr(ngrams, "_GROUP_BYTES", 64)  # a group per text or two
    assert rows(texts, 5) == whole == reference(texts, 5)


def test_same_hashes_in_another_process() -> None:
    code = ("from shardsmith.text.ngrams import word_ngram_hashes as f;"
            "print(f(['Der Bär 東京 läuft, schnell! ' * 3, 'kurz'], 5)[0].tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "99", "PYTHONPATH": ":".join(sys.path)}).stdout
    here = word_ngram_hashes(["Der Bär 東京 läuft, schnell! " * 3, "kurz"], 5)[0].tolist()
    assert json.loads(out) == here


@pytest.mark.parametrize("n", [1, 5, 13])
def test_a_long_text_hashed_in_blocks_gives_the_whole_texts_hashes(monkeypatch, n):
    """Blocks of a few bytes (every cut case: at a word, in an overlap, a last short block) give the
    hashes of the text hashed whole, in order."""
    import random

    from shardsmith.text import ngrams

    rng = random.Random(n)
    texts = [" ".join(rng.choice(["a", "bb", "ccc", "dddd", "é"]) for _ in range(rng.randint(0, 120))) for _ in range(30)]
    whole, whole_off = ngrams.word_ngram_hashes(texts, n, normalized=True)
    for block in (7, 13, 64):
        monkeypatch.setattr(ngrams, "_BLOCK_BYTES", block)
        got, off = ngrams.word_ngram_hashes(texts, n, normalized=True)
        assert off.tolist() == whole_off.tolist() and got.tolist() == whole.tolist(), block


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_words_hashed_a_chunk_at_a_time_give_the_same_hashes(monkeypatch, chunk):
    """Words cut by chunk edges (and a word longer than many chunks, as in a text without spaces)
    hash as when the whole buffer is taken at once."""
    import random

    from shardsmith.text import ngrams

    rng = random.Random(chunk)
    texts = [" ".join("x" * rng.randint(1, 40) if rng.random() < 0.2 else rng.choice(["a", "é", "東京", "bb"])
                      for _ in range(rng.randint(0, 30))) for _ in range(40)] + ["y" * 300]
    for n in (1, 5):
        whole = ngrams.word_ngram_hashes(texts, n, normalized=True)
        monkeypatch.setattr(ngrams, "_CHUNK_BYTES", chunk)
        got = ngrams.word_ngram_hashes(texts, n, normalized=True)
        monkeypatch.setattr(ngrams, "_CHUNK_BYTES", 1 << 20)
        assert got[0].tolist() == whole[0].tolist() and got[1].tolist() == whole[1].tolist()


def test_a_huge_text_takes_a_few_times_its_size():
    """A 16 MB text without a space (one word) and one of 16 MB of short words: numpy's peak stays
    within 8x the text (the word hashes a chunk at a time, the windows a block at a time; it took
    ~45x when a buffer of that size went through whole)."""
    import tracemalloc

    for text in ("x" * (16 << 20), "word " * (16 << 18)):
        tracemalloc.start()
        try:
            word_ngram_hashes([text], 5, normalized=True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 * len(text), (len(text), peak)
