"""Speed and estimate error of shardsmith's near-duplicate core (text/ngrams, text/minhash; issue 29).

    PYTHONPATH=. .venv/bin/python bench/bench_minhash_core.py --mb 20

On bench/corpus.py documents (one process; rensa's own threads as it starts them, see cpu/wall):
  ngrams          word_ngram_hashes(texts, 5), normalization included, and on pre-normalized text
  sign rensa      R-MinHash of those hashes (signing only), the signer text/minhash uses
  sign numpy      bench_minhash_libs.np_sign (k multiply-add-shift permutations) of the same hashes
  band_keys       the whole: normalize, 5-grams, sign, band keys
  near_duplicates clusters from the band keys, in memory and with a memory that forces spilling
Estimate error: signatures of --pairs planted near-duplicate pairs (bench_minhash_libs.make_pairs)
against the exact Jaccard of the same 5-gram hash sets.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_minhash_libs as libs  # noqa: E402
from harness import key_figure  # noqa: E402

from shardsmith.text.minhash import MinHashSpec, band_keys, near_duplicates, signatures  # noqa: E402
from shardsmith.text.ngrams import word_ngram_hashes  # noqa: E402
from shardsmith.text.textnorm import normalize  # noqa: E402


def timed(fn, repeat: int = 2):
    best, out = float("inf"), None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        best = min(best, time.perf_counter() - t)
        cpu = (time.process_time() - c) / max(time.perf_counter() - t, 1e-9)
    return out, best, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=20)
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--threshold", type=float, default=0.8)
    args = ap.parse_args()
    spec = MinHashSpec.for_threshold(args.threshold, seed=42)
    docs = libs.load_docs(args.mb, seed=0)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"{len(docs)} docs, {mb:.1f} MB; spec {spec.bands} bands x {spec.rows} rows of {spec.num_perm}")
    row = "{:<26} {:>7.3f} s {:>9.0f} docs/s {:>7.1f} MB/s  cpu/wall {:.2f}"

    (hashes, offsets), t, cpu = timed(lambda: word_ngram_hashes(docs, spec.ngram))
    print(row.format("ngrams (with normalize)", t, len(docs) / t, mb / t, cpu))
    norm = [normalize(d) for d in docs]
    _, t, cpu = timed(lambda: [normalize(d) for d in docs])
    print(row.format("normalize alone", t, len(docs) / t, mb / t, cpu))
    _, t, cpu = timed(lambda: word_ngram_hashes(norm, spec.ngram, normalized=True))
    print(row.format("ngrams (pre-normalized)", t, len(docs) / t, mb / t, cpu))
    from rensa import RMinHash
    off64 = offsets.astype(np.uint64)
    _, t, cpu = timed(lambda: np.array(RMinHash.digest_matrix_from_flat_token_hashes(
        hashes, off64, spec.num_perm, spec.seed).to_rows(), dtype=np.uint32))
    print(row.format("sign rensa (+ to numpy)", t, len(docs) / t, mb / t, cpu))
    _, t, cpu = timed(lambda: libs.np_sign(hashes, offsets, spec.num_perm, spec.seed), repeat=1)
    print(row.format("sign numpy", t, len(docs) / t, mb / t, cpu))
    keys, t, cpu = timed(lambda: band_keys(docs, spec))
    print(row.format("band_keys (all of it)", t, len(docs) / t, mb / t, cpu))
    key_figure("band_keys (normalize, 5-grams, sign, bands)", f"{mb / t:.1f} MB/s, {len(docs) / t:,.0f} docs/s")
    chunks = lambda: (keys[i:i + 4096] for i in range(0, len(keys), 4096))  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        first, t, cpu = timed(lambda: near_duplicates(chunks, len(docs), spec, memory=1 << 30, tmp_dir=tmp))
        print(row.format("near_duplicates (memory)", t, len(docs) / t, mb / t, cpu))
        spilled, t, cpu = timed(lambda: near_duplicates(chunks, len(docs), spec, memory=len(docs) * 16,
                                                        tmp_dir=tmp))
        print(row.format("near_duplicates (spilled)", t, len(docs) / t, mb / t, cpu))
    assert (first == spilled).all()
    print(f"clusters: {int((first != np.arange(len(docs))).sum())} documents joined to an earlier one")

    left, right, _ = libs.make_pairs(libs.load_docs(max(2.0, args.pairs * 4e-3), seed=1), args.pairs, seed=3)
    hl, ol = word_ngram_hashes(left, spec.ngram)
    hr, orr = word_ngram_hashes(right, spec.ngram)
    jac = np.array([len(set(hl[ol[i]:ol[i + 1]]) & set(hr[orr[i]:orr[i + 1]]))
                    / len(set(hl[ol[i]:ol[i + 1]]) | set(hr[orr[i]:orr[i + 1]])) for i in range(len(left))])
    for name, sa, sb in (("rensa", signatures(left, spec), signatures(right, spec)),
                         ("numpy", libs.np_sign(hl, ol, spec.num_perm, 42), libs.np_sign(hr, orr, spec.num_perm, 42))):
        err = (sa == sb).mean(axis=1) - jac
        print(f"estimate {name:<6} {len(jac)} pairs J {jac.min():.2f}-{jac.max():.2f}: bias {err.mean():+.4f} "
              f"MAE {np.abs(err).mean():.4f} RMSE {np.sqrt((err ** 2).mean()):.4f} max {np.abs(err).max():.3f} "
              f"(theory k permutations {np.sqrt((jac * (1 - jac) / spec.num_perm).mean()):.4f})")
        if name == "rensa":
            key_figure(f"Jaccard estimate, {len(jac)} pairs", f"RMSE {np.sqrt((err ** 2).mean()):.4f} (k permutations' "
                       f"theory {np.sqrt((jac * (1 - jac) / spec.num_perm).mean()):.4f})")
    kl, kr = band_keys(left, spec), band_keys(right, spec)
    cand = (kl == kr).any(axis=1)
    for lo, hi in ((0.5, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01)):
        sel = (jac >= lo) & (jac < hi)
        if sel.any():
            expect = np.mean([1 - (1 - j ** spec.rows) ** spec.bands for j in jac[sel]])
            print(f"candidates at J {lo:.1f}-{min(hi, 1):.1f}: {cand[sel].mean():.3f} of {sel.sum()} "
                  f"(S-curve {expect:.3f})")


if __name__ == "__main__":
    main()
