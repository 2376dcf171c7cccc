"""text/minhash: the parameters chosen from a threshold, band keys that find planted near copies and
are the same in another process, and clusters equal to a brute-force join whatever the memory."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.errors import UsageError
from shardsmith.text.minhash import MinHashSpec, band_keys, candidate_probability, near_duplicates

SPEC = MinHashSpec.for_threshold(0.8, seed=7)


def test_parameters_from_the_threshold() -> None:
    assert (SPEC.num_perm, SPEC.bands, SPEC.rows, SPEC.ngram) == (128, 16, 8, 5)
    for t in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95):
        s = MinHashSpec.for_threshold(t, seed=0)
        assert s.bands * s.rows <= s.num_perm
        assert candidate_probability(t, bands=s.bands, rows=s.rows) >= 0.9
        more = s.rows + 1  # the most rows that keep the recall at the threshold
        assert candidate_probability(t, bands=s.num_perm // more, rows=more) < 0.9
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(UsageError, match="between 0 and 1"):
            MinHashSpec.for_threshold(bad, seed=0)
    with pytest.raises(UsageError):
        MinHashSpec(threshold=0.8, num_perm=64, bands=16, rows=8, seed=0)
    d = SPEC.describe()
    assert d["signer"]["name"] == "rensa.RMinHash" and d["signer"]["version"].startswith("0.5")
    assert d["bands"] == 16 and d["verified"] is False and json.dumps(d)


def planted(n_base: int, seed: int) -> tuple[list[str], list[tuple[int, int]]]:
    """Distinct random documents, then a near copy of some (two words replaced: Jaccard ~0.85-0.9)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    docs = [" ".join(rng.choice(vocab) for _ in range(150)) for _ in range(n_base)]
    pairs = []
    for i in range(0, n_base, 3):
        words = docs[i].split()
        for _ in range(2):
            words[rng.randrange(len(words))] = rng.choice(vocab)
        pairs.append((i, len(docs)))
        docs.append(" ".join(words).upper() if i % 2 else " ".join(words))
    return docs, pairs


def test_planted_near_copies_are_found(tmp_path: Path) -> None:
    docs, pairs = planted(60, seed=1)
    keys = band_keys(docs, SPEC)
    assert keys.shape == (len(docs), 16) and keys.dtype == np.uint64
    first = near_duplicates(lambda: [keys[:25], keys[25:]], len(docs), SPEC, memory=1 << 30, tmp_dir=tmp_path)
    for a, b in pairs:
        assert first[b] == a and first[a] == a
    planted_copies = {b for _, b in pairs}
    assert [i for i in range(len(docs)) if first[i] != i] == sorted(planted_copies)
    # another seed draws other permutations: other keys, the same clusters here
    other = band_keys(docs, MinHashSpec.for_threshold(0.8, seed=8))
    assert not (other == keys).any()


def test_empty_texts_join_each_other_only(tmp_path: Path) -> None:
    texts = ["", "one", "  \n", "one two three four five", "", "one"]
    keys = band_keys(texts, SPEC)
    first = near_duplicates(lambda: [keys], len(texts), SPEC, memory=1 << 20, tmp_dir=tmp_path)
    assert first.tolist() == [0, 1, 0, 3, 0, 1]


def test_same_keys_in_another_process_and_thread_count() -> None:
    code = ("from shardsmith.text.minhash import MinHashSpec, band_keys;"
            "print(band_keys(['Der Bär läuft ' * 9, 'kurz', ''], MinHashSpec.for_threshold(0.8, seed=3)).tolist())")
    outs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      env={"PYTHONHASHSEED": h, "RAYON_NUM_THREADS": t,
                                           "PYTHONPATH": ":".join(sys.path)}).stdout)
            for h, t in (("1", "1"), ("2", "2"))]
    here = band_keys(["Der Bär läuft " * 9, "kurz", ""], MinHashSpec.for_threshold(0.8, seed=3)).tolist()
    assert outs[0] == outs[1] == here


def brute_force(keys: np.ndarray) -> list[int]:
    """Join every pair sharing a key in the same band, transitively; label by the smallest member."""
    n = len(keys)
    label = list(range(n))
    changed = True
    while changed:
        changed = False
        for i in range(n):
            for j in range(n):
                if (keys[i] == keys[j]).any() and label[j] > label[i]:
                    label[j] = label[i]
                    changed = True
    return label


@st.composite
def band_key_arrays(draw) -> tuple[np.ndarray, list[int]]:
    n = draw(st.integers(0, 40))
    bands = draw(st.integers(1, 4))
    values = draw(st.lists(st.integers(0, draw(st.sampled_from([3, 30, 2**64 - 1]))), min_size=n * bands,
                           max_size=n * bands))
    keys = np.array(values, dtype=np.uint64).reshape(n, bands)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    return keys, cuts


@settings(max_examples=120, deadline=None)
@given(band_key_arrays())
def test_clusters_equal_brute_force_for_any_memory(tmp_path_factory, case) -> None:
    keys, cuts = case
    n, bands = keys.shape
    spec = MinHashSpec(threshold=0.5, num_perm=bands, bands=bands, rows=1, seed=0)
    calls = []

    def chunks():
        calls.append(1)
        return np.split(keys, cuts)

    tmp = tmp_path_factory.mktemp("spill")
    big = near_duplicates(chunks, n, spec, memory=1 << 30, tmp_dir=tmp)
    passes_in_memory = len(calls)
    tiny = near_duplicates(chunks, n, spec, memory=max(16 * n, 64), tmp_dir=tmp)  # 8 parts a band
    assert big.dtype == np.int64 and big.tolist() == tiny.tolist() == brute_force(keys)
    assert (big <= np.arange(n)).all() and (big[big] == big).all()
    assert passes_in_memory <= 1 and list(tmp.iterdir()) == []  # spill files removed


def test_spill_partitions_and_passes(tmp_path: Path) -> None:
    """Enough documents that a tiny memory writes many partition files and several passes."""
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 2**64, (3000, 40), dtype=np.uint64)
    src, dst = rng.integers(0, 3000, 400), rng.integers(0, 3000, 400)
    band = rng.integers(0, 40, 400)
    keys[dst, band] = keys[src, band]
    spec = MinHashSpec(threshold=0.5, num_perm=40, bands=40, rows=1, seed=0)
    calls = []

    def chunks():
        calls.append(1)
        return (keys[i:i + 700] for i in range(0, 3000, 700))

    big = near_duplicates(chunks, 3000, spec, memory=1 << 30, tmp_dir=tmp_path)
    assert len(calls) == 1
    small = near_duplicates(chunks, 3000, spec, memory=3000 * 16 * 4 // 8, tmp_dir=tmp_path)
    assert len(calls) > 2  # 16 partitions a band: 16 bands a pass
    assert (big == small).all() and (big != np.arange(3000)).sum() >= 300
    for j in range(40):  # every pair sharing a key in a band is in one cluster
        order = np.argsort(keys[:, j], kind="stable")
        same = keys[order[1:], j] == keys[order[:-1], j]
        assert same.any() and (big[order[1:]][same] == big[order[:-1]][same]).all()


def test_bad_chunks_are_refused(tmp_path: Path) -> None:
    keys = np.zeros((3, 16), dtype=np.uint64)
    with pytest.raises(ValueError, match="held 3 documents, not 4"):
        near_duplicates(lambda: [keys], 4, SPEC, memory=1 << 20, tmp_dir=tmp_path)
    with pytest.raises(ValueError, match="uint64"):
        near_duplicates(lambda: [keys[:, :3]], 3, SPEC, memory=1 << 20, tmp_dir=tmp_path)
