"""Near duplicates by MinHash with LSH banding (``--dedup minhash``): each document's band keys, then
clusters of documents that share a band key, joined transitively, in bounded memory.

Signatures are rensa's R-MinHash (``RMinHash.digest_matrix_from_flat_token_hashes``) over the
word 5-gram hashes of ``text.ngrams``, seeded: the same documents give the same keys on every run.
Measured on bench/corpus.py text (bench/bench_minhash_libs.py, bench/README.md "MinHash
libraries"): rensa's flat-hash call signs at ~850 MB/s where a vectorized numpy signer (k
multiply-add-shift permutations) does ~30 and datasketch ~4, and its estimates are closer to the
exact Jaccard (RMSE 0.030 against 0.035 for k permutations at 128), so nothing is traded for the
speed. Its digests may change with its version: ``describe()`` records rensa's version and
ALGORITHM_VERSION, and pyproject pins the minor version.

Candidates are not verified against the threshold: as in datatrove's MinHash pipeline (bucket
collisions, then union-find), a shared band key joins two documents, so the results compare.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardsmith.errors import UsageError
from shardsmith.kit.keys import GOLDEN, mix64
from shardsmith.text.ngrams import word_ngram_hashes

NUM_PERM = 128
CANDIDATE_AT_THRESHOLD = 0.9
_MAX_OPEN_FILES = 256


@dataclass(frozen=True, kw_only=True)
class MinHashSpec:
    """What near-duplicate detection computes: ``bands`` x ``rows`` of a ``num_perm`` signature over
    word ``ngram``-grams, seeded. Two documents are candidates when all rows of some band agree."""

    threshold: float
    num_perm: int
    bands: int
    rows: int
    ngram: int = 5
    seed: int

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise UsageError(f"the MinHash threshold must be between 0 and 1 (exclusive), not {self.threshold}")
        if min(self.num_perm, self.bands, self.rows, self.ngram) < 1 or self.bands * self.rows > self.num_perm:
            raise UsageError(f"MinHash needs bands x rows <= permutations, all positive: {self.bands} x "
                             f"{self.rows} of {self.num_perm}, {self.ngram}-grams")
        if not 0 <= self.seed < 1 << 64:
            raise UsageError(f"the MinHash seed must be a 64-bit unsigned integer, not {self.seed}")

    @classmethod
    def for_threshold(cls, threshold: float, *, seed: int, ngram: int = 5) -> MinHashSpec:
        """128 permutations at any threshold; ``rows`` the most for which ``bands = 128 // rows`` makes a
        pair at exactly the threshold a candidate with probability >= 0.9 (1 - (1 - t**r)**b), and
        ``bands`` that. More rows make the S-curve steeper (fewer pairs far below the threshold
        joined); the 0.9 keeps the recall at the threshold. At 0.8: 16 bands x 8 rows, a candidate
        with probability 0.06 / 0.24 / 0.61 / 0.95 / 0.9999 at Jaccard 0.5 / 0.6 / 0.7 / 0.8 / 0.9,
        close to datatrove's default 14 x 8 (0.05 / 0.21 / 0.57 / 0.92 / 0.9996). 128 permutations:
        the estimate's error at 128 is ~0.03 (RMSE), and signing costs grow with them."""
        if not 0 < threshold < 1:
            raise UsageError(f"the MinHash threshold must be between 0 and 1 (exclusive), not {threshold}")
        rows = max((r for r in range(1, NUM_PERM + 1)
                    if candidate_probability(threshold, bands=NUM_PERM // r, rows=r) >= CANDIDATE_AT_THRESHOLD),
                   default=1)
        return cls(threshold=threshold, num_perm=NUM_PERM, bands=NUM_PERM // rows, rows=rows, ngram=ngram,
                   seed=seed)

    def describe(self) -> dict:
        """The spec and the signer's version, for the manifest: band keys are only comparable when
        all of it is equal."""
        import importlib.metadata

        from rensa import RMinHash
        return {"threshold": self.threshold, "num_perm": self.num_perm, "bands": self.bands, "rows": self.rows,
                "ngram": self.ngram, "seed": self.seed,
                "signer": {"name": "rensa.RMinHash", "version": importlib.metadata.version("rensa"),
                           "algorithm_version": int(RMinHash.ALGORITHM_VERSION)},
                "verified": False,
                "candidate_at": {str(s): round(candidate_probability(s, bands=self.bands, rows=self.rows), 4)
                                 for s in (0.5, 0.6, 0.7, 0.8, 0.9)}}


def candidate_probability(jaccard: float, *, bands: int, rows: int) -> float:
    """The chance two documents at this Jaccard share a band key (the LSH S-curve)."""
    return 1.0 - (1.0 - jaccard ** rows) ** bands


def signatures(texts: Sequence[str], spec: MinHashSpec, *, normalized: bool = False) -> np.ndarray:
    """(len(texts), num_perm) uint32 R-MinHash signatures of the texts' word n-gram hashes. A text
    with no words has the signature of the empty set (every slot 2**32 - 1), which no text with a
    word has: texts with no words are duplicates of each other, and of nothing else."""
    from rensa import RMinHash
    hashes, offsets = word_ngram_hashes(texts, spec.ngram, normalized=normalized)
    out = np.empty((len(texts), spec.num_perm), dtype=np.uint32)
    if len(texts):
        digests = RMinHash.digest_matrix_from_flat_token_hashes(hashes, offsets.astype(np.uint64),
                                                                spec.num_perm, spec.seed)
        out[:] = digests.to_rows()
    return out


def band_keys(texts: Sequence[str], spec: MinHashSpec, *, normalized: bool = False) -> np.ndarray:
    """(len(texts), bands) uint64: band j's key is a 64-bit hash of (seed, j, its rows of the
    signature), so two documents share key j exactly when those rows agree (bar 2**-64 chances)."""
    sig = signatures(texts, spec, normalized=normalized)[:, :spec.bands * spec.rows]
    sig = sig.reshape(len(texts), spec.bands, spec.rows).astype(np.uint64)
    with np.errstate(over="ignore"):
        salt = mix64(np.uint64(spec.seed) ^ mix64(np.arange(spec.bands, dtype=np.uint64) * GOLDEN + GOLDEN))
        keys = np.broadcast_to(salt, (len(texts), spec.bands)).copy()
        for r in range(spec.rows):
            keys = mix64(keys ^ sig[:, :, r])
    return keys


def near_duplicates(chunks: Callable[[], Iterable[np.ndarray]], n_docs: int, spec: MinHashSpec, *, memory: int,
                    tmp_dir: str | Path) -> np.ndarray:
    """``first[i]``: the smallest index of document i's cluster (i itself when it is kept).

    ``chunks()`` yields (m, bands) uint64 band keys in document order; it is called once per pass
    (it may re-read files). Documents sharing the key of a band are joined, transitively. In memory
    are the union-find array (8 B a document) and what ``memory // 4`` holds of a band's (key,
    document) pairs; beyond that the pairs spill to files under ``tmp_dir``, partitioned by a hash of
    the key. The result is the same for any ``memory``."""
    parent = np.arange(n_docs, dtype=np.int64)
    budget = max(memory // 4, 1)
    per_band = max(n_docs, 1) * 16
    if per_band <= budget:
        group, parts = min(spec.bands, budget // per_band), 1
    else:
        parts = 1 << math.ceil(math.log2(2 * per_band / budget))
        group = max(1, min(spec.bands, _MAX_OPEN_FILES // parts))
    for b0 in range(0, spec.bands, group):
        bands = range(b0, min(b0 + group, spec.bands))
        if parts == 1:
            keys = _columns(chunks, n_docs, spec.bands, bands)
            for j in range(keys.shape[1]):
                order = np.argsort(keys[:, j], kind="stable")
                _join_runs(parent, keys[order, j], order)
        else:
            _spilled(parent, chunks, n_docs, spec.bands, bands, parts, tmp_dir)
    return _roots(parent, np.arange(n_docs, dtype=np.int64))


def _checked(chunks: Callable[[], Iterable[np.ndarray]], n_docs: int, n_bands: int) -> Iterable[tuple[int, np.ndarray]]:
    """(first document, keys) of every chunk, checked against the promised shape."""
    at = 0
    for chunk in chunks():
        chunk = np.asarray(chunk)
        if chunk.ndim != 2 or chunk.shape[1] != n_bands or chunk.dtype != np.uint64:
            raise ValueError(f"band keys must be (m, {n_bands}) uint64, not {chunk.shape} {chunk.dtype}")
        yield at, chunk
        at += len(chunk)
    if at != n_docs:
        raise ValueError(f"the chunks held {at} documents, not {n_docs}")


def _columns(chunks: Callable[[], Iterable[np.ndarray]], n_docs: int, n_bands: int, bands: range) -> np.ndarray:
    out = np.empty((n_docs, len(bands)), dtype=np.uint64)
    for at, chunk in _checked(chunks, n_docs, n_bands):
        out[at:at + len(chunk)] = chunk[:, bands.start:bands.stop]
    return out


def _spilled(parent: np.ndarray, chunks: Callable[[], Iterable[np.ndarray]], n_docs: int, n_bands: int,
             bands: range, parts: int, tmp_dir: str | Path) -> None:
    """One pass writing each band's (key, document) pairs to ``parts`` files by the top bits of a hash
    of the key, then each file sorted and joined on its own."""
    shift = np.uint64(64 - int(math.log2(parts)))
    folder = Path(tempfile.mkdtemp(prefix="minhash-", dir=tmp_dir))
    try:
        files = {(j, p): open(folder / f"{j}-{p}.bin", "wb") for j in bands for p in range(parts)}  # noqa: SIM115
        try:
            for at, chunk in _checked(chunks, n_docs, n_bands):
                docs = np.arange(at, at + len(chunk), dtype=np.uint64)
                for j in bands:
                    keys = chunk[:, j]
                    part = mix64(keys) >> shift
                    order = np.argsort(part, kind="stable")  # documents stay in order within a part
                    cuts = np.searchsorted(part[order], np.arange(parts + 1, dtype=np.uint64))
                    pairs = np.stack([keys[order], docs[order]], axis=1)
                    for p in range(parts):
                        if cuts[p + 1] > cuts[p]:
                            files[j, p].write(pairs[cuts[p]:cuts[p + 1]].tobytes())
        finally:
            for fh in files.values():
                fh.close()
        for j in bands:
            for p in range(parts):
                path = folder / f"{j}-{p}.bin"
                pairs = np.fromfile(path, dtype=np.uint64).reshape(-1, 2)
                path.unlink()
                order = np.argsort(pairs[:, 0], kind="stable")
                _join_runs(parent, pairs[order, 0], pairs[order, 1].astype(np.int64))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _join_runs(parent: np.ndarray, keys: np.ndarray, docs: np.ndarray) -> None:
    """Join every document of a run of equal sorted keys to the run's first."""
    if len(keys) < 2:
        return
    same = keys[1:] == keys[:-1]
    if not same.any():
        return
    run_start = np.maximum.accumulate(np.where(np.concatenate([[False], same]), 0, np.arange(len(keys))))
    member = np.flatnonzero(np.concatenate([[False], same]))
    _union(parent, docs[run_start[member]], docs[member])


def _union(parent: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Union-find, vectorized: each round links every edge's larger root under its smaller one (the
    smallest offer per root wins, the others link next round), so a root is its cluster's smallest
    document whatever order edges come in."""
    while len(a):
        ra, rb = _roots(parent, a), _roots(parent, b)
        differ = ra != rb
        a, b, ra, rb = a[differ], b[differ], ra[differ], rb[differ]
        np.minimum.at(parent, np.maximum(ra, rb), np.minimum(ra, rb))


def _roots(parent: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The roots of ``x``, compressing their paths on the way."""
    r = parent[x]
    while True:
        up = parent[r]
        if np.array_equal(up, r):
            break
        r = up
    parent[x] = r
    return r
