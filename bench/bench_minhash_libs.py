"""Compare three ways to compute seeded MinHash signatures over word 5-grams (issue 29, part 2).

    .venv/bin/pip install rensa datasketch xxhash
    .venv/bin/python bench/bench_minhash_libs.py --mb 20 --num-perm 128,256

Documents come from bench/corpus.py's generator (same bytes for the same --seed). A shingle is
five consecutive whitespace-separated words (``text.split()``); a document is its set of shingles.

Speed table, one row per (method, num_perm):
  sign_s     seconds to turn the shingles of all documents into signatures (shingling excluded)
  docs/s     signatures per second, sign_s only
  MB/s       text megabytes (10**6 B of UTF-8) per second, sign_s only
  MB/s+sh    the same, adding the time to build that method's input from the text
             ("py shingles" = byte strings of the 5-grams; "np shingles" = numpy 64-bit hashes)
  cpu/wall   process CPU seconds / wall seconds while signing (> 1: the library used threads)
  bias/MAE/RMSE/max  error of the estimated Jaccard (share of equal signature slots) against the exact
             Jaccard of the 5-gram sets, over --pairs planted near-duplicate pairs with J in 0.5-1.0
  det        "yes" when a second Python process (other PYTHONHASHSEED) gives identical signatures

Methods:
  datasketch      datasketch.MinHash(num_perm, seed).update_batch(shingles), one object per document
  rensa           rensa.RMinHash (R-MinHash = Fast Similarity Sketching, not k independent permutations:
                  each token fills a bucketed slot, so its variance is below sqrt(J(1-J)/P); FxHash
                  token hashing; its bulk calls may use Rayon threads, see cpu/wall)
                  here RMinHash(num_perm, seed).update(shingles), one object per document
  rensa-bulk      RMinHash.digest_matrix_from_token_byte_sets (one call for all documents)
  rensa-flat      RMinHash.digest_matrix_from_flat_token_hashes fed with the numpy shingle hashes
  numpy           own code: xxh64 of each word, shingle hash = splitmix64-mixed combination of the
                  five word hashes (vectorized), then P hash functions h_i(x) = ((a_i*x + b_i) mod 2**64)
                  >> 32 (multiply-add-shift; numpy has no 128-bit product, so no mod 2**61-1), and a
                  min over each document's shingles (np.minimum.reduceat)

Last, the LSH banding (datasketch's _optimal_param: minimise 0.5*FP area + 0.5*FN area of the
S-curve 1-(1-s**r)**b around the threshold) for --threshold and each num_perm, with S-curve values.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
from harness import key_figure  # noqa: E402

NGRAM = 5
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def load_docs(mb: float, seed: int) -> list[str]:
    pieces, docs, size, i = corpus.Pieces(corpus.word_list()), [], 0, 0
    while size < mb * 1e6:
        for line in corpus.chunk(pieces, seed, i).splitlines():
            docs.append(json.loads(line)["text"])
            size += len(line)
            if size >= mb * 1e6:
                break
        i += 1
    return docs


def py_shingles(text: str) -> list[bytes]:
    w = text.split()
    if len(w) < NGRAM:
        return [" ".join(w).encode()]
    return [" ".join(w[i:i + NGRAM]).encode() for i in range(len(w) - NGRAM + 1)]


def _mix(x: np.ndarray) -> np.ndarray:  # splitmix64 finalizer, wrapping uint64 arithmetic
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def np_shingles(docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Flat uint64 shingle hashes of all documents and their row offsets (len(docs) + 1)."""
    h = xxhash.xxh64_intdigest
    words = [d.split() for d in docs]
    lens = np.array([len(w) for w in words], dtype=np.int64)
    wh = np.fromiter((h(t.encode()) for w in words for t in w), dtype=np.uint64, count=int(lens.sum()))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    n_sh = np.maximum(lens - NGRAM + 1, 1)
    offsets = np.concatenate([[0], np.cumsum(n_sh)])
    # start index (into wh) of every shingle; a short document gets one shingle of its words
    first = np.repeat(starts, n_sh) + (np.arange(offsets[-1]) - np.repeat(offsets[:-1], n_sh))
    stop = np.repeat(starts + lens, n_sh)
    with np.errstate(over="ignore"):
        acc = np.full(len(first), 0x9E3779B97F4A7C15, dtype=np.uint64)
        for j in range(NGRAM):
            idx = first + j
            ok = idx < stop
            acc = _mix(acc ^ np.where(ok, wh[np.minimum(idx, len(wh) - 1)], np.uint64(j)))
    return acc, offsets


def np_params(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.integers(0, 2**63, num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd
    b = rng.integers(0, 2**63, num_perm, dtype=np.uint64)
    return a, b


def np_sign(hashes: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int, batch: int = 1 << 13) -> np.ndarray:
    a, b = np_params(num_perm, seed)
    out = np.empty((len(offsets) - 1, num_perm), dtype=np.uint32)
    d0 = 0
    with np.errstate(over="ignore"):
        while d0 < len(offsets) - 1:  # batches of whole documents, about `batch` shingles each
            d1 = max(d0 + 1, int(np.searchsorted(offsets, offsets[d0] + batch, "right")) - 1)
            d1 = min(d1, len(offsets) - 1)
            x = hashes[offsets[d0]:offsets[d1]]
            v = ((a[:, None] * x[None, :] + b[:, None]) >> np.uint64(32)).astype(np.uint32)
            out[d0:d1] = np.minimum.reduceat(v, offsets[d0:d1] - offsets[d0], axis=1).T
            d0 = d1
    return out


def sign(method: str, docs: list[str], num_perm: int, seed: int) -> tuple[np.ndarray, float, float, float]:
    """Signatures (n_docs x num_perm), seconds to build the input, seconds to sign, CPU seconds to sign."""
    t0 = time.perf_counter()
    if method in ("numpy", "rensa-flat"):
        hashes, offsets = np_shingles(docs)
    else:
        sh = [py_shingles(d) for d in docs]
    t1, c1 = time.perf_counter(), time.process_time()
    if method == "numpy":
        sig = np_sign(hashes, offsets, num_perm, seed)
    elif method == "rensa-flat":
        from rensa import RMinHash
        sig = RMinHash.digest_matrix_from_flat_token_hashes(hashes, offsets.astype(np.uint64), num_perm, seed)
    elif method == "rensa-bulk":
        from rensa import RMinHash
        sig = RMinHash.digest_matrix_from_token_byte_sets(sh, num_perm, seed)
    elif method == "rensa":
        from rensa import RMinHash
        sig = []
        for s in sh:
            m = RMinHash(num_perm, seed)
            m.update(s)
            sig.append(m.digest())
    elif method == "datasketch":
        from datasketch import MinHash
        sig = []
        for s in sh:
            m = MinHash(num_perm=num_perm, seed=seed)
            m.update_batch(s)
            sig.append(m.hashvalues)
    t2, c2 = time.perf_counter(), time.process_time()
    return _as_array(sig, len(docs), num_perm), t1 - t0, t2 - t1, c2 - c1


def _as_array(sig, n: int, num_perm: int) -> np.ndarray:
    if hasattr(sig, "to_rows"):  # rensa.RMinHashDigestMatrix
        sig = sig.to_rows()
    return np.asarray(sig, dtype=np.uint64).reshape(n, num_perm)


def make_pairs(docs: list[str], n_pairs: int, seed: int) -> tuple[list[str], list[str], np.ndarray]:
    """Near copies: replace a few words, maybe drop or add a sentence; keep pairs with exact J >= 0.5."""
    rng = np.random.default_rng(seed)
    vocab = corpus.word_list()
    left, right, jac = [], [], []
    for d in docs:
        w = d.split()
        if len(w) < 60:
            continue
        w2 = list(w)
        for i in rng.integers(0, len(w2), int(len(w2) * rng.uniform(0.0, 0.05))):
            w2[i] = vocab[int(rng.integers(0, 2000))]
        sents = " ".join(w2).split(". ")
        r = rng.random()
        if r < 0.3 and len(sents) > 2:
            del sents[int(rng.integers(0, len(sents)))]
        elif r < 0.6:
            sents.insert(int(rng.integers(0, len(sents) + 1)), " ".join(vocab[int(i)] for i in rng.integers(0, 5000, 15)))
        d2 = ". ".join(sents)
        a, b = set(py_shingles(d)), set(py_shingles(d2))
        j = len(a & b) / len(a | b)
        if j >= 0.5:
            left.append(d)
            right.append(d2)
            jac.append(j)
        if len(jac) >= n_pairs:
            break
    return left, right, np.array(jac)


def optimal_param(threshold: float, num_perm: int, w_fp: float = 0.5, w_fn: float = 0.5) -> tuple[int, int]:
    def area(b: int, r: int, lo: float, hi: float, neg: bool) -> float:
        s = np.linspace(lo, hi, 401)
        p = 1 - (1 - s ** r) ** b
        return float(np.trapezoid(1 - p if neg else p, s))
    best, opt = float("inf"), (0, 0)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            err = w_fp * area(b, r, 0.0, threshold, False) + w_fn * area(b, r, threshold, 1.0, True)
            if err < best:
                best, opt = err, (b, r)
    return opt


def digest_of(method: str, docs: list[str], num_perm: int, seed: int) -> str:
    return hashlib.sha256(sign(method, docs, num_perm, seed)[0].tobytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=20, help="MB of corpus text for the speed rows")
    ap.add_argument("--num-perm", default="128,256", help="comma-separated permutation counts")
    ap.add_argument("--methods", default="numpy,rensa-flat,rensa-bulk,rensa,datasketch")
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=42, help="MinHash seed")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    perms = [int(p) for p in args.num_perm.split(",")]
    methods = args.methods.split(",")
    if "datasketch" in methods and importlib.util.find_spec("datasketch") is None:  # a peer tool: its row says so
        methods.remove("datasketch")
        args.methods = ",".join(methods)
        print("datasketch: not installed (pip install datasketch)")
    det_docs = load_docs(0.2, seed=7)[:100]
    if args.child:  # determinism check: print one digest per (method, num_perm)
        print(json.dumps({f"{m}/{p}": digest_of(m, det_docs, p, args.seed) for m in methods for p in perms}))
        return
    env = dict(os.environ, PYTHONHASHSEED="12345")
    child = subprocess.run([sys.executable, __file__, "--child", "--methods", args.methods, "--num-perm",
                            args.num_perm, "--seed", str(args.seed)], env=env, capture_output=True, text=True, check=True)
    other = json.loads(child.stdout)
    t0 = time.perf_counter()
    docs = load_docs(args.mb, seed=0)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    left, right, jac = make_pairs(load_docs(max(2.0, args.pairs * 2e-3 * 2), seed=1), args.pairs, seed=3)
    print(f"{len(docs)} docs, {mb:.1f} MB text (generated in {time.perf_counter() - t0:.1f} s); "
          f"{len(jac)} pairs, exact J {jac.min():.2f}-{jac.max():.2f} (mean {jac.mean():.2f})")
    print(f"{'method':<11} {'perm':>4} {'sign_s':>7} {'docs/s':>8} {'MB/s':>7} {'MB/s+sh':>7} {'cpu/wall':>8}"
          f" {'bias':>7} {'MAE':>6} {'RMSE':>6} {'max':>6} {'det':>4}")
    for p in perms:
        speed = {}
        for m in methods:
            sig, t_in, t_sign, c_sign = sign(m, docs, p, args.seed)
            speed[m] = mb / (t_sign + t_in)
            sa = sign(m, left, p, args.seed)[0]
            sb = sign(m, right, p, args.seed)[0]
            err = (sa == sb).mean(axis=1) - jac
            det = "yes" if other[f"{m}/{p}"] == digest_of(m, det_docs, p, args.seed) else "NO"
            print(f"{m:<11} {p:>4} {t_sign:>7.2f} {len(docs) / t_sign:>8.0f} {mb / t_sign:>7.1f}"
                  f" {mb / (t_sign + t_in):>7.1f} {c_sign / t_sign:>8.2f} {err.mean():>+7.4f} {np.abs(err).mean():>6.4f}"
                  f" {np.sqrt((err ** 2).mean()):>6.4f}"
                  f" {np.abs(err).max():>6.3f} {det:>4}", flush=True)
        fastest = max(speed, key=speed.get)
        key_figure(f"signatures, {p} permutations", f"{fastest} fastest at {speed[fastest]:.1f} MB/s with shingling"
                   + ("".join(f"; {speed[fastest] / v:.1f}x {m}'s" for m, v in speed.items() if m == "datasketch")))
        print(f"{'(theory)':<11} {p:>4} {'':>7} {'':>8} {'':>7} {'':>7} {'':>8} {'':>7} {'':>6}"
              f" {np.sqrt((jac * (1 - jac) / p).mean()):>6.4f}  RMSE sqrt(J(1-J)/P)")
    for p in perms:
        b, r = optimal_param(args.threshold, p)
        curve = "  ".join(f"P({s})={1 - (1 - s ** r) ** b:.3f}" for s in (0.5, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95))
        print(f"LSH threshold {args.threshold} num_perm {p}: {b} bands x {r} rows ({b * r} used)  {curve}")


if __name__ == "__main__":
    main()
