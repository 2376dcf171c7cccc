"""Deterministic synthetic English-like JSONL corpus for the pack-tokens benchmarks.

    python bench/corpus.py --mb 200 -o /tmp/corpus.jsonl

Each line is ``{"text": "..."}``: a document of about 250 B to 10 KB made of Zipf-distributed
words from a fixed, generated word list (with capitalised sentence starts, punctuation, numbers,
paragraph breaks and some non-ASCII words). The bytes depend only on ``--seed`` and ``--mb``
(1 MB = 10**6 bytes). Text is assembled from fixed-width rows with numpy, at 100+ MB/s.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import sys
import time
from pathlib import Path

import numpy as np

CHUNK_WORDS = 1 << 20  # words generated per chunk; each chunk has its own RNG stream
N_WORDS = 40_000
SYLLABLES = [c + v for c in ["", "b", "br", "c", "ch", "d", "f", "g", "gr", "h", "k", "l", "m", "n", "p",
                             "pr", "r", "s", "sh", "st", "t", "th", "tr", "v", "w", "y", "z"]
             for v in ["a", "e", "i", "o", "u", "ou", "ea", "ai", "er", "in", "an", "on", "en"]]
ENDINGS = ["", "", "", "s", "ed", "ing", "ly", "er", "tion", "ness", "al", "ic"]
ACCENTS = {"a": "á", "e": "é", "i": "ï", "o": "ö", "u": "ü", "n": "ñ", "c": "ç", "s": "ß"}
FOREIGN = ["東京", "大阪", "数据", "模型", "москва", "данные", "αλφα", "βήτα", "€", "—", "naïve", "café",
           "Zürich", "São", "Ωmega", "ünïcode", "日本語", "学习", "😀", "→"]
# Separators after a word: (bytes as they appear inside the JSON string, relative weight, ends a sentence).
SEPARATORS = [(b" ", 800, False), (b", ", 70, False), (b". ", 50, True), (b"? ", 4, True),
              (b"! ", 3, True), (b"; ", 5, False), (b": ", 5, False), (b" - ", 4, False),
              (b" (", 2, False), (b") ", 2, False), (b".\\n\\n", 10, True), (b"\\n", 3, True),
              (b' \\"', 2, False), (b'\\" ', 2, False)]
LINE_START = b'{"text": "'
LINE_END = b'."}\n'


def word_list(seed: int = 12345) -> list[str]:
    """The fixed vocabulary, most frequent first: invented words, some accented, numbers, foreign words."""
    rnd = random.Random(seed).random  # only random() is used: its stream is stable across Python versions

    def pick(seq: list[str]) -> str:
        return seq[int(rnd() * len(seq))]

    words: list[str] = []
    seen: set[str] = set()
    while len(words) < N_WORDS:
        rank = len(words)
        n_syl = 1 + min(int(-math.log(1.0 - rnd()) * (0.6 + rank / 8000)), 4)
        w = "".join(pick(SYLLABLES) for _ in range(n_syl)) + (pick(ENDINGS) if rank > 300 else "")
        r = rnd()
        if rank > 50 and r < 0.03:  # a word with accented letters
            w = "".join(ACCENTS.get(ch, ch) if rnd() < 0.4 else ch for ch in w)
        elif rank > 100 and r < 0.05:  # a number
            a, b = int(rnd() * 1000), int(rnd() * 1000)
            w = pick([str(a % 100), str(1800 + a % 230), f"{a},{b:03d}", f"{a / 10:.2f}"])
        elif rank > 200 and r < 0.054:
            w = pick(FOREIGN) + (w if rnd() < 0.5 else "")
        cap = w[:1].upper() + w[1:]
        if w and w not in seen and len(w.encode()) < 16 and len(cap.encode()) < 16:
            seen.add(w)
            words.append(w)
    return words


class Pieces:
    """Words and separators as fixed 16-byte, zero-padded rows.

    A word has four rows: plain, capitalised, and both again with the space that follows
    most words, so that most words take one row and not two.
    """

    def __init__(self, words: list[str]):
        caps = [w[:1].upper() + w[1:] for w in words]
        self.n_words = len(words)
        self.words = _rows([w.encode() for w in words + caps] + [(w + " ").encode() for w in words + caps])
        # The last separator of a document closes its line and opens the next one.
        self.seps = _rows([s for s, _, _ in SEPARATORS] + [LINE_END + LINE_START])
        self.line_end = len(SEPARATORS)
        self.sep_ends = np.array([e for _, _, e in SEPARATORS] + [True])
        ranks = np.arange(1, len(words) + 1, dtype=np.float64)
        # Inverse-CDF lookup tables: a uniform integer draw indexes them (Zipf for words).
        self.word_table = _inverse_cdf(1.0 / (ranks + 2.7) ** 1.07, 1 << 22)
        self.sep_table = _inverse_cdf(np.array([wt for _, wt, _ in SEPARATORS], dtype=np.float64), 1 << 12)


def _rows(items: list[bytes]) -> np.ndarray:
    """Items as a 1-D array of 16-byte void rows, zero-padded (no item contains a zero byte)."""
    assert all(0 < len(b) <= 16 and b"\0" not in b for b in items)
    return np.array([b.ljust(16, b"\0") for b in items], dtype="S16").view("V16")


def _inverse_cdf(weights: np.ndarray, size: int) -> np.ndarray:
    """A table of `size` entries in which item i fills a share weights[i] / sum(weights)."""
    bounds = np.rint(np.cumsum(weights / weights.sum()) * size).astype(np.int64)
    return np.repeat(np.arange(len(weights), dtype=np.int32), np.diff(bounds, prepend=0))


def chunk(pieces: Pieces, seed: int, index: int) -> bytes:
    """The bytes of chunk `index`: whole JSONL lines of about CHUNK_WORDS words in all.

    Each word is followed by one separator. Words are laid out as 16-byte rows (a word with
    its space, or a word and then its separator); dropping the zero padding leaves the text.
    """
    rng = np.random.default_rng([seed, index])
    doc_words = np.clip(rng.lognormal(np.log(300), 0.8, size=CHUNK_WORDS // 200), 40, 1500).astype(np.int64)
    doc_words = doc_words[: max(1, int(np.searchsorted(np.cumsum(doc_words), CHUNK_WORDS)))]
    n = int(doc_words.sum())
    words = pieces.word_table[rng.integers(0, len(pieces.word_table), n, dtype=np.uint32)]
    seps = pieces.sep_table[rng.integers(0, len(pieces.sep_table), n, dtype=np.uint32)]
    seps[np.cumsum(doc_words) - 1] = pieces.line_end
    caps = np.zeros(n, dtype=bool)
    caps[1:] = pieces.sep_ends[seps[:-1]]
    caps[0] = True
    space = seps == 0
    words += caps * np.int32(pieces.n_words) + space * np.int32(2 * pieces.n_words)
    extra = ~space  # words followed by a row of their own separator
    pos = np.arange(n) + np.cumsum(extra) - extra
    rows = np.empty(n + int(extra.sum()), dtype="V16")
    rows[pos] = pieces.words[words]
    rows[pos[extra] + 1] = pieces.seps[seps[extra]]
    flat = rows.view(np.uint8)
    body = flat[flat != 0].tobytes()
    return LINE_START + body[: -len(LINE_START)]


_PIECES: Pieces | None = None


def _chunk_in_worker(args: tuple[int, int]) -> bytes:
    global _PIECES
    if _PIECES is None:
        _PIECES = Pieces(word_list())
    return chunk(_PIECES, *args)


def write_corpus(path: str | Path, mb: float, seed: int = 0, workers: int = 2) -> int:
    """Write about `mb` * 10**6 bytes of JSONL (cut after the line that crosses the size); return bytes written.

    Chunks are generated in `workers` processes; chunk i depends only on (seed, i).
    """
    target = int(mb * 1e6)
    written, index = 0, 0
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with multiprocessing.Pool(workers) as pool, open(path, "wb") as f:
        while written < target:
            batch = range(index, index + (target - written) // 6_000_000 + 2)
            for data in pool.imap(_chunk_in_worker, [(seed, i) for i in batch]):
                if written + len(data) >= target:
                    data = data[: data.index(b"\n", target - written - 1) + 1]
                f.write(data)
                written += len(data)
                if written >= target:
                    break
            index = batch.stop
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100, help="size in MB (10**6 bytes)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="processes (the bytes do not depend on it)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    n = write_corpus(args.output, args.mb, args.seed, args.workers)
    dt = time.perf_counter() - t0
    print(f"wrote {n / 1e6:.1f} MB to {args.output} in {dt:.2f} s ({n / 1e6 / dt:.0f} MB/s)", file=sys.stderr)


if __name__ == "__main__":
    main()
