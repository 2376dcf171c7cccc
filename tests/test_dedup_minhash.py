"""pack-tokens --dedup minhash: near copies dropped (the first of each cluster in input order stays),
clusters joined transitively, the same documents for any workers, memory (spilled buckets) or seed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import WORDS, run_cli, tree_digest, write_jsonl
from test_dedup_exact import pack, staged_pack

# many processes a test (DataLoader workers, killed ranks, an S3 server, a browser) or long: `make test-heavy`
pytestmark = pytest.mark.heavy


def _doc(rng: random.Random, n: int) -> list[str]:
    return [f"{rng.choice(WORDS)}{rng.randint(0, 99)}" for _ in range(n)]


def near_corpus(root: Path, *, n: int = 300, seed: int = 0) -> tuple[list[str], dict[int, int]]:
    """Documents of 150-250 words; about one in five is followed later by a copy with one word in
    a hundred changed (Jaccard of 5-grams ~0.9), and some copies by a copy of the copy. Returns the
    documents in input order and, for each copy, the original (first) it descends from."""
    rng = random.Random(seed)
    docs: list[list[str]] = []
    origin: dict[int, int] = {}
    for _ in range(n):
        if docs and rng.random() < 0.25:
            src = rng.randrange(len(docs))
            words = list(docs[src])
            for _ in range(max(1, len(words) // 100)):
                words[rng.randrange(len(words))] = "edited"
            origin[len(docs)] = origin.get(src, src)
            docs.append(words)
        else:
            docs.append(_doc(rng, rng.randint(150, 250)))
    texts = [" ".join(w) for w in docs]
    write_jsonl(root / "a.jsonl", texts[: n // 2])
    write_jsonl(root / "b.jsonl", texts[n // 2:])
    return texts, origin


def test_near_copies_are_dropped_and_point_at_the_first_of_their_cluster(tmp_path, bpe_tokenizer):
    texts, origin = near_corpus(tmp_path / "in")
    m = pack(tmp_path / "in", tmp_path / "out", bpe_tokenizer, "--dedup", "minhash", "--removed", tmp_path / "rm.jsonl")
    listed = [json.loads(x) for x in (tmp_path / "rm.jsonl").read_text().splitlines()]

    def index(entry: dict) -> int:
        return entry["record"] + (0 if entry["file"] == "a.jsonl" else len(texts) // 2)

    got = {index(e): index(e["duplicate_of"]) for e in listed}
    assert got == origin, "every near copy, and only those, points at its cluster's first document"
    assert all(e["rule"] == "minhash" for e in listed)
    d = m["cleaning"]["dedup"]
    assert d["documents"] == len(origin) and (d["bands"], d["rows"], d["num_perm"]) == (16, 8, 128)
    assert m["splits"]["train"]["samples"] == len(texts) - len(origin)


def test_same_documents_for_any_workers_memory_and_seed(tmp_path, bpe_tokenizer):
    near_corpus(tmp_path / "in", n=2000, seed=1)
    a = pack(tmp_path / "in", tmp_path / "a", bpe_tokenizer, "--dedup", "minhash", "--removed", tmp_path / "a.jsonl")
    # 2,000 documents' band pairs (32 KB a band) beyond --memory / 4: they spill to files
    b = pack(tmp_path / "in", tmp_path / "b", bpe_tokenizer, "--dedup", "minhash", "--removed", tmp_path / "b.jsonl",
             "--workers", "2", "--memory", "100KB")
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    c = pack(tmp_path / "in", tmp_path / "c", bpe_tokenizer, "--dedup", "minhash", "--removed", tmp_path / "c.jsonl",
             "--seed", "9")
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text() == (tmp_path / "c.jsonl").read_text()
    assert a["cleaning"] == b["cleaning"] == c["cleaning"] and a["cleaning"]["dedup"]["documents"] > 300


def test_the_threshold_is_checked_in_one_line(tmp_path, bpe_tokenizer):
    near_corpus(tmp_path / "in", n=20)
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "-q",
                  "--dedup", "minhash", "--dedup-threshold", "1.5")
    assert res.exit_code == 2 and "--dedup-threshold" in res.stderr and "Traceback" not in res.stderr


def test_stages_drop_and_trace_what_a_local_run_does(tmp_path, bpe_tokenizer):
    """Scatter and gather ranks with --dedup minhash and --provenance: the bytes of a local run,
    origins sidecars included."""
    near_corpus(tmp_path / "in", n=400, seed=2)
    args = ("--dedup", "minhash", "--provenance", "--seq-len", "64", "--split", "train=0.8,val=0.2")
    pack(tmp_path / "in", tmp_path / "one", bpe_tokenizer, *args)
    out = tmp_path / "staged"
    staged_pack(tmp_path / "in", out, bpe_tokenizer, *args)
    assert tree_digest(out) == tree_digest(tmp_path / "one")
    assert any(p.name.endswith(".origins.npy") for p in out.iterdir())
    res = run_cli("verify", out)
    assert res.exit_code == 0, res.stderr


def test_a_run_killed_at_each_step_resumes_to_the_same_bytes(tmp_path, bpe_tokenizer):
    """SIGKILL after a scatter task (its facts and part whole), and in the gather (the duplicates
    decided): the rerun reuses what is whole and writes the bytes of an uninterrupted run."""
    import os
    import signal

    from conftest import run_subprocess

    near_corpus(tmp_path / "in", n=600, seed=3)
    args = ["pack-tokens", tmp_path / "in", "--tokenizer", bpe_tokenizer, "--memory", "200KB",
            "--dedup", "minhash", "--provenance", "--seq-len", "64", "-q"]
    pack(tmp_path / "in", tmp_path / "ref", bpe_tokenizer, *args[4:])
    # the scatter's tasks run in workers (the kill takes their parent too); one gather writer runs in the command
    for point, workers, parent in (("scatter:1", "2", {"SHARDSMITH_CRASH_PARENT": "1"}), ("gather:train:0", "1", {})):
        out = tmp_path / point.replace(":", "-")
        res = run_subprocess(*args, "--workers", workers, "-o", out,
                             env={**os.environ, "SHARDSMITH_CRASH_AT": point, **parent})
        assert res.returncode == -signal.SIGKILL, (point, res.returncode, res.stderr)
        assert (out.parent / f".{out.name}.shardsmith-work" / "facts").is_dir()
        res = run_subprocess(*args, "--workers", workers, "-o", out)
        assert res.returncode == 0, res.stderr
        assert tree_digest(out) == tree_digest(tmp_path / "ref"), point
