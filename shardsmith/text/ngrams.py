"""64-bit hashes of the word n-grams of texts: the shingles near-duplicate detection (``--dedup
minhash``, 5-grams) and benchmark decontamination (``--decontaminate``, 13-grams) compare.

Words are the normalized text (``textnorm.normalize``) split at its single spaces. The hash of a
word sequence is a pure function of its words, fixed here once (stored signatures and band keys
depend on it; changing a constant changes every one of them):

    word(w)        = mix64(poly(b + 1 for b in utf8(w); P) + len(utf8(w)) * L)
    seq(w1 .. wm)  = mix64(poly(word(w1) .. word(wm); Q) + m * L)
    poly(x0 .. xk; B) = x0 + x1*B + x2*B**2 + ... + xk*B**k   (mod 2**64)

with ``mix64`` splitmix64's finalizer (``kit.keys``). A text of k >= n words gives its k - n + 1
windows of n words; a text of 0 < k < n words gives one hash, ``seq`` of all its words, which is
the hash of the same k words met as a k-gram window anywhere: a short benchmark item is matched
whole (``word_ngram_hashes([doc], k)`` holds ``word_ngram_hashes([item], n)``). An empty text
gives none.

Why a polynomial: B is odd, so invertible mod 2**64, and the hash of bytes (or words) s..e-1 is
``(S[e] - S[s]) * B**-s`` from one prefix sum ``S`` of ``x[j] * B**j``: numpy's wrapping uint64
cumsum hashes every word of a batch, then every window, with no Python loop per word.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardsmith.errors import UsageError
from shardsmith.kit.keys import mix64
from shardsmith.text.textnorm import normalize

P = 0x9E3779B97F4A7C15  # byte base (odd)
Q = 0xD6E8FEB86659FD93  # word base (odd)
L = 0xC2B2AE3D27D4EB4F  # length term
_MASK = (1 << 64) - 1
_GROUP_BYTES = 1 << 18  # texts hashed together: a few hundred KB keeps numpy's passes in cache
_BLOCK_BYTES = 1 << 20  # a longer text is hashed a block at a time (``_blocks``)
_CHUNK_BYTES = 1 << 20  # the bytes whose word hashes are taken at once (``_word_polys``)
_TABLE_CAP = 1 << 24  # power tables kept between calls up to this length (128 MiB each at most)
_tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _powers(base: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``base**j`` and ``base**-j`` mod 2**64 for j < size (at least), cached per base."""
    have = _tables.get(base)
    if have is not None and len(have[0]) >= size:
        return have
    length = max(size, 1 << 12) if size > _TABLE_CAP else 1 << max(12, (size - 1).bit_length())
    tables = []
    for b in (base, pow(base, -1, 1 << 64)):
        t = np.full(length, b, dtype=np.uint64)
        t[0] = 1
        tables.append(np.cumprod(t, dtype=np.uint64))  # wraps mod 2**64
    pair = (tables[0], tables[1])
    if length <= _TABLE_CAP:
        _tables[base] = pair
    return pair


def _span_hashes(x: np.ndarray, base: int, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """poly(x[s:e]; base) for every (s, e), by one prefix sum."""
    up, down = _powers(base, len(x) + 1)
    prefix = np.zeros(len(x) + 1, dtype=np.uint64)
    np.cumsum(x * up[:len(x)], out=prefix[1:])
    return (prefix[stops] - prefix[starts]) * down[starts]


def _word_polys(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """poly(b + 1 for b in buf[s:e]; P) of every word, ``_CHUNK_BYTES`` of the buffer at a time
    (a word that runs across chunks is the sum of its parts' polys, each times P to its offset in
    the word): the memory it takes is bounded, however long a word (a text without spaces)."""
    out = np.zeros(len(starts), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for a in range(0, max(len(buf), 1), _CHUNK_BYTES):
            b = min(a + _CHUNK_BYTES, len(buf))
            lo, hi = np.searchsorted(stops, a, side="right"), np.searchsorted(starts, b, side="left")
            if lo >= hi:
                continue
            s, e = np.maximum(starts[lo:hi], a), np.minimum(stops[lo:hi], b)
            x = buf[a:b].astype(np.uint64)
            x += np.uint64(1)
            part = _span_hashes(x, P, s - a, e - a)
            shift = s - starts[lo:hi]  # the part's offset in its word: nonzero only for a word begun before a
            moved = np.flatnonzero(shift)
            for k in moved.tolist():
                part[k] *= np.uint64(pow(P, int(shift[k]), 1 << 64))
            out[lo:hi] += part
    return out


def _group_hashes(encoded: list[bytes], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n-gram hashes of a group of UTF-8 texts, and how many each text gave."""
    sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    buf = np.frombuffer(b" ".join(encoded) + b" ", dtype=np.uint8)
    stops = np.flatnonzero(buf == 32)  # every word ends at a space (the one appended ends the last)
    starts = np.empty_like(stops)
    starts[0] = 0
    starts[1:] = stops[:-1] + 1
    real = stops > starts  # drop the empty "words" of empty texts
    starts, stops = starts[real], stops[real]
    bounds = np.empty(len(encoded) + 1, dtype=np.int64)
    bounds[0] = 0
    np.cumsum(sizes + 1, out=bounds[1:])
    first = np.searchsorted(starts, bounds)  # words of text i: first[i]:first[i + 1]
    k = np.diff(first)
    first = first[:-1]
    with np.errstate(over="ignore"):
        words = mix64(_word_polys(buf, starts, stops) + (stops - starts).astype(np.uint64) * np.uint64(L))
        up, down = _powers(Q, len(words) + 1)
        prefix = np.zeros(len(words) + 1, dtype=np.uint64)
        np.cumsum(words * up[:len(words)], out=prefix[1:])
        # the window of n words at every word, kept where it ends inside its text
        full = (prefix[n:] - prefix[:-n]) * down[:max(len(words) - n + 1, 0)]
        inside = np.ones(len(full), dtype=bool)
        for j in range(1, n):
            w = first + k - j  # a window starting here would run past its text's end
            inside[w[(w >= first) & (w < len(full))]] = False
        grams = mix64(full[inside] + np.uint64(n) * np.uint64(L))
        windows = np.maximum(k - n + 1, 0)
        short = np.flatnonzero((k > 0) & (k < n))
        if len(short):  # a text shorter than n: one hash, of all its words
            s, m = first[short], k[short]
            whole = mix64((prefix[s + m] - prefix[s]) * down[s] + m.astype(np.uint64) * np.uint64(L))
            grams = np.insert(grams, (np.cumsum(windows) - windows)[short], whole)
            windows[short] = 1
    return grams, windows


def _blocks(data: bytes, n: int) -> list[bytes]:
    """A long text as blocks of about ``_BLOCK_BYTES`` cut at spaces, each running n - 1 words into
    the next: every window of n words lies in exactly one block as its first words' window, so the
    blocks' hashes are the text's, in order, and the memory a block's hashing takes is bounded
    (about 45 bytes a byte of text). A text of fewer than 2n words, or without spaces, stays whole."""
    spaces = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 32)
    if len(data) <= _BLOCK_BYTES or len(spaces) < 2 * n:
        return [data]
    word_starts = np.concatenate([[0], spaces + 1])  # word i starts at word_starts[i]
    words = len(word_starts)
    cuts = np.unique(np.searchsorted(word_starts, np.arange(0, len(data), _BLOCK_BYTES), side="right") - 1)
    cuts = cuts[cuts <= words - n]  # a block starts at a word with a whole window after it
    out = []
    for a, b in zip(cuts.tolist(), [*cuts[1:].tolist(), None]):
        start = int(word_starts[a])
        stop = len(data) if b is None or b + n - 1 >= words else int(word_starts[b + n - 1]) - 1
        out.append(data[start:stop])
    return out


def word_ngram_hashes(texts: Sequence[str], n: int, *, normalized: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The uint64 hashes of every text's word n-grams, back to back, and int64 offsets (len + 1):
    text i's are ``hashes[offsets[i]:offsets[i + 1]]``, in window order.

    ``normalized``: the texts are already ``textnorm.normalize``d (words split at single spaces).
    A long text is hashed a block at a time (``_blocks``): the same hashes, in bounded memory."""
    if n < 1:
        raise UsageError(f"the n-gram size must be at least 1, not {n}")
    counts = np.zeros(len(texts) + 1, dtype=np.int64)
    units: list[tuple[int, bytes]] = []  # (text, bytes): a text, or one block of a long one
    for t, text in enumerate(texts):
        data = (text if normalized else normalize(text)).encode("utf-8", "surrogatepass")
        units += [(t, block) for block in _blocks(data, n)]
    parts: list[np.ndarray] = []
    i = 0
    while i < len(units):
        j, size = i, 0
        while j < len(units) and (j == i or size + len(units[j][1]) < _GROUP_BYTES):
            size += len(units[j][1]) + 1
            j += 1
        grams, got = _group_hashes([u[1] for u in units[i:j]], n)
        parts.append(grams)
        np.add.at(counts, np.fromiter((u[0] + 1 for u in units[i:j]), dtype=np.int64, count=j - i), got)
        i = j
    offsets = np.cumsum(counts)
    return (np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)), offsets
