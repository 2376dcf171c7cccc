"""The tokens writers' origins sidecars and ``sources(i)``, built by running the writers directly on
batches that carry origins: plain windows (across shard boundaries) and best-fit packed sequences
(documents cut and reordered), ``verify`` against a sidecar with the wrong rows, and a dataset
made without provenance."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from shardsmith.core.manifest import new_manifest
from shardsmith.errors import DatasetError
from shardsmith.formats.tokens.dataset import TokenDataset
from shardsmith.formats.tokens.packed import PackedSequences, packing_stats
from shardsmith.formats.tokens.packed_writer import PackedTokensWriter
from shardsmith.formats.tokens.writer import TokensWriter
from shardsmith.kit.batches import SortedBatch
from shardsmith.kit.doc_origin import DOC_ORIGIN

INPUTS = ["a.jsonl", "b.parquet"]


def corpus(n: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Documents whose every token says which document it is (id = 1000 + document), some empty,
    and an origin row for each."""
    rng = np.random.default_rng(seed)
    docs = [np.full(int(rng.integers(0, 40)) if i % 9 else 0, 1000 + i, dtype=np.uint16) for i in range(n)]
    origins = np.zeros(n, DOC_ORIGIN)
    origins["file"] = np.arange(n) % 2
    origins["record"] = np.arange(n) * 3 + 1
    origins["offset"] = np.where(origins["file"] == 0, np.arange(n) * 100, -1)
    origins["hash"] = np.arange(n) * 7919
    return docs, origins


def batches(docs: list[np.ndarray], origins: np.ndarray | None, sizes: list[int]) -> list[SortedBatch]:
    out, at = [], 0
    for size in sizes:
        part = docs[at:at + size]
        lengths = np.array([2 * len(d) for d in part], dtype=np.int64)
        payload = np.concatenate(part).view(np.uint8) if part else np.zeros(0, np.uint8)
        batch = SortedBatch.of(lengths, memoryview(payload.tobytes()))
        batch.origins = None if origins is None else origins[at:at + size]
        out.append(batch)
        at += size
    return out


def finish(out: Path, writer, *, packed: dict | None = None) -> dict:
    """Write the manifest a run would write around the writer's shards."""
    shards = [s.to_json() for s in writer.close()]
    split = {"samples": sum(s["samples"] for s in shards), "tokens": sum(s["tokens"] for s in shards),
             "shards": shards}
    extras = {}
    if packed is not None:
        split["packing"] = packing_stats(shards, seq_len=packed["seq_len"])
        extras["packing"] = {"method": "best-fit", "window_tokens": 64, **packed, **split["packing"]}
    m = new_manifest(fmt="tokens", seed=0, shuffle=True,
                     source={"reader": "jsonl+parquet", "inputs": INPUTS, "input_units": ["line", "row"],
                             "input_sizes": [1, 1], "text_field": "text"},
                     schema={"tokens": {"kind": "tokens", "dtype": "uint16", "ragged": True}},
                     splits={"train": split},
                     tokenizer={"path": "tokenizer.json", "sha256": hashlib.sha256(b"{}").hexdigest(),
                                "vocab_size": 1 << 16, "dtype": "uint16"},
                     seq_len=None, **extras)
    (out / "tokenizer.json").write_bytes(b"{}")  # verify hashes it
    (out / "manifest.json").write_text(json.dumps(m))
    return m


def plain(out: Path, docs, origins, *, provenance: bool = True, sizes=(7, 1, 30, 0, 22)) -> dict:
    w = TokensWriter(out_dir=out, split="train", dtype=np.dtype(np.uint16), shard_tokens=150, provenance=provenance)
    for b in batches(docs, origins if provenance else None, list(sizes)):
        w.write_sorted(b)
    return finish(out, w)


def test_the_sidecar_holds_each_shards_documents_in_order(tmp_path):
    docs, origins = corpus(60)
    m = plain(tmp_path, docs, origins)
    shards = m["splits"]["train"]["shards"]
    assert len(shards) > 2
    rows = []
    for s in shards:
        side = s["origins"]
        assert side["path"] == s["path"].replace(".bin", ".origins.npy")
        got = np.load(tmp_path / side["path"], allow_pickle=False)
        assert got.dtype == DOC_ORIGIN and len(got) == s["samples"]
        tokens = np.fromfile(tmp_path / s["path"], dtype=np.uint16)
        first = np.unique(tokens - 1000)  # the documents the shard's tokens belong to
        assert set(first.tolist()) <= set((got["record"] - 1) // 3)
        rows.append(got)
    assert np.array_equal(np.concatenate(rows), origins)


def test_one_writer_or_another_batching_makes_the_same_bytes(tmp_path):
    docs, origins = corpus(60)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    ma, mb = plain(a, docs, origins), plain(b, docs, origins, sizes=(60,))
    assert [s["origins"] for s in ma["splits"]["train"]["shards"]] == \
        [s["origins"] for s in mb["splits"]["train"]["shards"]]


def test_a_batch_without_origins_fails_loudly_and_writes_no_sidecar(tmp_path):
    docs, origins = corpus(10)
    w = TokensWriter(out_dir=tmp_path, split="train", dtype=np.dtype(np.uint16), shard_tokens=10_000, provenance=True)
    (batch,) = batches(docs, None, [10])
    with pytest.raises(AssertionError, match="without its documents' origins"):
        w.write_sorted(batch)
    (short,) = batches(docs, origins, [10])
    short.origins = origins[:9]
    with pytest.raises(AssertionError, match="9 origin rows"):
        w.write_sorted(short)
    assert not list(tmp_path.glob("*.origins.npy"))
    pw = PackedTokensWriter(out_dir=tmp_path, split="train", dtype=np.dtype(np.uint16), shard_tokens=64, seq_len=16,
                            pad_id=0, window_tokens=64, provenance=True)
    with pytest.raises(AssertionError):
        pw.write_sorted(batch)


@pytest.mark.parametrize("seq_len", [8, 50])
def test_sources_of_a_window_are_its_documents_and_their_spans(tmp_path, seq_len):
    docs, origins = corpus(60, seed=seq_len)
    plain(tmp_path, docs, origins)
    ds = TokenDataset(tmp_path, seq_len=seq_len)
    assert len(ds) > 5
    for i in range(len(ds)):
        x, y = ds[i]
        tokens = np.concatenate([x, y[-1:]])  # the window's L + 1 tokens
        got = ds.sources(i)
        assert got[0]["start"] == 0 and got[-1]["stop"] == seq_len + 1
        assert [a["stop"] for a in got[:-1]] == [b["start"] for b in got[1:]]  # back to back
        for d in got:
            doc = int(tokens[d["start"]]) - 1000
            assert (tokens[d["start"]:d["stop"]] == 1000 + doc).all()
            assert d["record"] == origins["record"][doc] and d["input"] == INPUTS[doc % 2]
            unit = "line" if doc % 2 == 0 else "row"
            assert d[unit] == d["record"] + 1
            assert d["offset"] == (doc * 100 if doc % 2 == 0 else None) and d["hash"] == doc * 7919


@pytest.mark.parametrize("seq_len", [8, 40])
def test_sources_of_a_packed_sequence_follow_the_documents_as_placed(tmp_path, seq_len):
    docs, origins = corpus(80, seed=3)
    w = PackedTokensWriter(out_dir=tmp_path, split="train", dtype=np.dtype(np.uint16), shard_tokens=4 * seq_len,
                           seq_len=seq_len, pad_id=7, window_tokens=64, provenance=True)
    for b in batches(docs, origins, [5, 30, 1, 44]):
        w.write_sorted(b)
    m = finish(tmp_path, w, packed={"seq_len": seq_len, "pad_id": 7})
    shards = m["splits"]["train"]["shards"]
    for s in shards:  # a row per piece, as the boundaries list them
        ends = np.load(tmp_path / s["boundaries"]["path"])
        assert len(np.load(tmp_path / s["origins"]["path"])) == len(ends)
    ds = PackedSequences(tmp_path)
    pieces: dict[int, int] = {}
    for i in range(len(ds)):
        item, got = ds[i], ds.sources(i)
        cu = item["cu_seqlens"].tolist()
        assert [(d["start"], d["stop"]) for d in got] == list(zip(cu[:-1], cu[1:]))
        for d in got:
            doc = int(item["tokens"][d["start"]]) - 1000
            assert (item["tokens"][d["start"]:d["stop"]] == 1000 + doc).all()
            assert d["record"] == origins["record"][doc] and d["hash"] == doc * 7919
            pieces[doc] = pieces.get(doc, 0) + d["stop"] - d["start"]
    assert pieces == {i: len(d) for i, d in enumerate(docs) if len(d)}  # every token of every document, once
    assert any(len(d) > seq_len for d in docs) == (seq_len == 8)  # cut documents, and none


def test_verify_counts_the_rows_and_a_dataset_without_provenance_says_so(tmp_path):
    docs, origins = corpus(40)
    m = plain(tmp_path, docs, origins)
    assert run_cli("verify", tmp_path).exit_code == 0
    shard = m["splits"]["train"]["shards"][1]
    side = tmp_path / shard["origins"]["path"]
    rows = np.load(side)
    buf = io.BytesIO()
    np.save(buf, rows[:-1], allow_pickle=False)  # one row short, hashed anew: only the count shows it
    side.write_bytes(buf.getvalue())
    shard["origins"].update(bytes=len(buf.getvalue()), sha256=hashlib.sha256(buf.getvalue()).hexdigest())
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    res = run_cli("verify", tmp_path)
    assert res.exit_code == 1 and f"{len(rows) - 1} origin rows" in res.output
    bare = tmp_path / "bare"
    bare.mkdir()
    plain(bare, docs, origins, provenance=False)
    assert not list(bare.glob("*.origins.npy"))
    with pytest.raises(DatasetError, match="without --provenance"):
        TokenDataset(bare, seq_len=8).sources(0)
    res = run_cli("trace", bare, "0", "--seq-len", "8")
    assert res.exit_code == 1 and "without --provenance" in res.stderr and "Traceback" not in res.stderr
