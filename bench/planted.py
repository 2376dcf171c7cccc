"""A JSONL corpus with planted duplicates and benchmark contamination, and its ground truth (issue 29).

    python bench/planted.py --mb 50 -o /tmp/planted [--seed 0] [--files 8]

Writes OUT/corpus/part-00000.jsonl ... (``{"text": ...}``, one document a line, the stream cut into
``--files`` files of about equal size; input order = sorted files, then line), OUT/bench.jsonl (the
benchmark: ``--items`` items of 20-60 words, ``{"text": ...}``), OUT/truth.npz and OUT/truth.json.

Documents come from bench/corpus.py's generator (Zipf words, punctuation, paragraphs, some non-ASCII;
~2.9 KB mean, lognormal tail to ~10 KB). Each document, in order, is (drawn independently):
  * 10 % an exact copy of an earlier original (half verbatim, half with changed case and whitespace:
    equal after ``shardsmith.text.textnorm.normalize``, which is checked; a variant that fails the
    check is written verbatim);
  * 10 % a near copy of an earlier original: a few words replaced, maybe a sentence removed or one
    added, until the Jaccard similarity of the word 5-gram sets of the normalized texts (computed,
    not assumed) lies in 0.7-0.95, aimed at a uniform draw from that range;
  * otherwise an original; 1 % of originals get a benchmark item pasted in at a sentence boundary
    (verbatim, or upper-cased, or with its spaces doubled). Copies inherit it.
A copy's source is drawn from the last 20,000 originals (70 %) or from a seeded reservoir of 5,000
older ones (30 %), so copies land in other files too and memory stays bounded at any size.

Ground truth, one row per document in input order (truth.npz): ``file_id`` (index into truth.json's
``files``), ``line`` (0-based), ``kind`` (0 original, 1 exact copy, 2 exact after normalization,
3 near copy), ``source`` (global index of the original it copies, -1), ``jaccard`` (5-gram Jaccard
with the source; 1.0 for exact kinds, nan for originals), ``item`` (the benchmark item it shares a
13-word n-gram with after normalization, -1), ``nbytes`` (its JSONL line). The bytes depend only on
(--seed, --mb, --files, --items).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
import corpus  # noqa: E402

from shardsmith.text.textnorm import normalize  # noqa: E402

NGRAM = 5
DECON_NGRAM = 13
WINDOW, RESERVOIR = 20_000, 5_000
KINDS = ("original", "exact", "exact-normalized", "near")
VERSION = 1


def shingles(text: str, n: int = NGRAM) -> set[str]:
    """The word n-grams of the normalized text (a text of fewer than n words: one n-gram of all of it)."""
    w = normalize(text).split(" ")
    if len(w) < n:
        return {" ".join(w)}
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if (a or b) else 1.0


def base_texts(seed: int) -> Iterator[str]:
    """corpus.py's documents, chunk after chunk (chunk i depends only on (seed, i))."""
    pieces, i = corpus.Pieces(corpus.word_list()), 0
    while True:
        for line in corpus.chunk(pieces, seed, i).splitlines():
            yield json.loads(line)["text"]
        i += 1


def make_items(rng: np.random.Generator, vocab: list[str], n: int) -> list[str]:
    """Benchmark items: 20-60 words of the vocabulary's less common half, as one or two sentences."""
    items = []
    for _ in range(n):
        k = int(rng.integers(20, 61))
        words = [vocab[int(i)] for i in rng.integers(200, len(vocab), k)]
        cut = int(rng.integers(8, k - 8))
        words[0] = words[0][:1].upper() + words[0][1:]
        words[cut - 1] += "."
        words[cut] = words[cut][:1].upper() + words[cut][1:]
        items.append(" ".join(words) + ("?" if rng.random() < 0.3 else "."))
    return items


def case_space_variant(text: str, rng: np.random.Generator) -> str:
    """The text with changed case and whitespace (the caller checks it normalizes the same)."""
    r = rng.random()
    if r < 0.3:
        text = text.upper()
    elif r < 0.5:
        text = text.lower()
    elif r < 0.7:
        text = " ".join(w[:1].upper() + w[1:] for w in text.split(" "))
    parts = text.split(" ")
    for i in rng.integers(0, len(parts), max(1, len(parts) // 20)):
        parts[i] += rng.choice(["  ", "\t", "\n", " \u00a0"]) if rng.random() < 0.7 else ""
    text = " ".join(parts).replace("\n\n", "\n \n" if rng.random() < 0.5 else "\r\n\r\n")
    return rng.choice(["", " ", "\n"]) + text + rng.choice(["", "  ", "\n"])


def near_copy(text: str, target: float, vocab: list[str], rng: np.random.Generator) -> tuple[str, float]:
    """A near copy of ``text``: ``k`` words replaced and maybe a sentence added or removed, ``k`` tuned
    until the 5-gram Jaccard with ``text`` lies in 0.7-0.95 (the closest try otherwise)."""
    src = shingles(text)
    words = text.split(" ")
    n = max(len(src), 1)
    k = max(1, round(n * (1 - target) / (1 + target) / NGRAM))
    op = rng.choice(["none", "add", "remove"]) if n > 150 else "none"
    best: tuple[float, str, float] = (9.0, text, 1.0)
    for attempt in range(10):
        w = list(words)
        for i in rng.integers(0, len(w), k):
            tail = w[i][len(w[i].rstrip(".,;:!?\n\"()")):]  # keep the punctuation and line break after it
            w[i] = vocab[int(rng.integers(0, 8000))] + tail
        sents = " ".join(w).split(". ")
        if op == "remove" and len(sents) > 3:
            del sents[int(rng.integers(1, len(sents)))]
        elif op == "add":
            new = " ".join(vocab[int(i)] for i in rng.integers(0, 8000, int(rng.integers(6, 16))))
            sents.insert(int(rng.integers(1, len(sents) + 1)), new[:1].upper() + new[1:])
        out = ". ".join(sents)
        j = jaccard(src, shingles(out))
        if 0.7 <= j <= 0.95 and abs(j - target) < 0.03:
            return out, j
        miss = abs(j - target) + (0 if 0.7 <= j <= 0.95 else 1)
        if miss < best[0]:
            best = (miss, out, j)
        if attempt >= 4:
            op = "none"
        k = max(1, round(k * (1.5 if j > target else 0.6))) if k > 1 or j > target else 1
    return best[1], best[2]


def plant_item(text: str, item: str, rng: np.random.Generator) -> str:
    r = rng.random()
    if r < 0.2:
        item = item.upper()
    elif r < 0.4:
        item = item.replace(" ", "  ")
    sents = text.split(". ")
    i = int(rng.integers(0, len(sents) + 1))
    return ". ".join(sents[:i] + [item[:-1]] + sents[i:]) if i < len(sents) else text + " " + item


def contains_item(text: str, item_grams: set[str]) -> bool:
    return not item_grams.isdisjoint(shingles(text, DECON_NGRAM))


def generate(out: str | Path, mb: float, seed: int = 0, files: int = 8, n_items: int = 1000) -> dict:
    """Write the corpus, benchmark and truth under ``out`` (see the module docstring); returns truth.json."""
    out = Path(out)
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 29])
    vocab = corpus.word_list()
    items = make_items(np.random.default_rng([seed, 29, 1]), vocab, n_items)
    item_grams = [shingles(t, DECON_NGRAM) for t in items]
    with open(out / "bench.jsonl", "wb") as f:
        f.write(b"".join(json.dumps({"text": t}, ensure_ascii=False).encode() + b"\n" for t in items))
    target, per_file = int(mb * 1e6), int(mb * 1e6) / files
    cols: dict[str, list] = {k: [] for k in ("file", "line", "kind", "source", "jaccard", "item", "nbytes")}
    recent: deque[tuple[int, str, int]] = deque(maxlen=WINDOW)  # (index, text, item) of originals
    reservoir: list[tuple[int, str, int]] = []
    seen_old = 0
    base = base_texts(seed)
    names = [f"part-{i:05d}.jsonl" for i in range(files)]
    fi, line, written, f = 0, 0, 0, open(out / "corpus" / names[0], "wb")  # noqa: SIM115
    try:
        while written < target:
            u, idx = rng.random(), len(cols["kind"])
            kind, source, jac = 0, -1, float("nan")
            if u < 0.2 and recent:
                pool = reservoir if (rng.random() < 0.3 and reservoir) else recent
                source, src_text, item = pool[int(rng.integers(0, len(pool)))]
                if u < 0.1:
                    kind, jac, text = 1, 1.0, src_text
                    if rng.random() < 0.5:
                        variant = case_space_variant(src_text, rng)
                        if normalize(variant) == normalize(src_text) and variant != src_text:
                            kind, text = 2, variant
                else:
                    kind = 3
                    text, jac = near_copy(src_text, float(rng.uniform(0.7, 0.95)), vocab, rng)
                    if item >= 0 and not contains_item(text, item_grams[item]):
                        item = -1
            else:
                text, item = next(base), -1
                if rng.random() < 0.01:
                    item = int(rng.integers(0, n_items))
                    text = plant_item(text, items[item], rng)
                    assert contains_item(text, item_grams[item])
                if len(recent) == WINDOW:  # the oldest of the window goes to the reservoir (algorithm R)
                    old = recent[0]
                    seen_old += 1
                    if len(reservoir) < RESERVOIR:
                        reservoir.append(old)
                    elif (j := int(rng.integers(0, seen_old))) < RESERVOIR:
                        reservoir[j] = old
                recent.append((idx, text, item))
            data = json.dumps({"text": text}, ensure_ascii=False).encode() + b"\n"
            f.write(data)
            for k, v in zip(cols, (fi, line, kind, source, jac, item, len(data))):
                cols[k].append(v)
            written += len(data)
            line += 1
            if written >= per_file * (fi + 1) and fi + 1 < files and written < target:
                f.close()
                fi, line = fi + 1, 0
                f = open(out / "corpus" / names[fi], "wb")  # noqa: SIM115 (rotated; closed below)
    finally:
        f.close()
    truth = {"file_id": np.array(cols["file"], np.int32), "line": np.array(cols["line"], np.int64),
             "kind": np.array(cols["kind"], np.int8), "source": np.array(cols["source"], np.int64),
             "jaccard": np.array(cols["jaccard"], np.float32), "item": np.array(cols["item"], np.int32),
             "nbytes": np.array(cols["nbytes"], np.int64)}
    np.savez(out / "truth.npz", **truth)
    kinds = np.bincount(truth["kind"], minlength=4)
    near = truth["jaccard"][truth["kind"] == 3]
    meta = {"version": VERSION, "seed": seed, "mb": mb, "files": names[:fi + 1], "bench": "bench.jsonl",
            "items": n_items, "documents": len(truth["kind"]), "bytes": written,
            "kinds": dict(zip(KINDS, kinds.tolist())), "contaminated": int((truth["item"] >= 0).sum()),
            "near_jaccard": {"min": float(near.min()) if len(near) else None,
                             "max": float(near.max()) if len(near) else None,
                             "mean": float(near.mean()) if len(near) else None},
            "mean_doc_bytes": written / max(1, len(truth["kind"])),
            "sha256": {n: hashlib.sha256((out / "corpus" / n).read_bytes()).hexdigest() for n in names[:fi + 1]}}
    (out / "truth.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def load_truth(out: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    out = Path(out)
    with np.load(out / "truth.npz") as z:
        return json.loads((out / "truth.json").read_text()), {k: z[k] for k in z.files}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50, help="corpus size in MB (10**6 bytes)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--items", type=int, default=1000)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    meta = generate(args.output, args.mb, args.seed, args.files, args.items)
    print(json.dumps({k: v for k, v in meta.items() if k != "sha256"}))
    print(f"wrote {meta['bytes'] / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
