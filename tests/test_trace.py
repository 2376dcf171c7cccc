"""pack-tokens --provenance end to end: every window's and packed sequence's documents name the input
lines and rows their tokens came from (checked against the inputs read here and tokenized again),
the same bytes for any workers, ``shardsmith trace`` prints them with their text (or says changed
or missing), and ``trace --state`` names the batch a saved StatefulDataLoader yields next."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import make_docs, run_cli, tree_digest

import shardsmith
from shardsmith.formats.tokens.packed import PackedSequences

SEQ = 24


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plain JSONL with blank lines, gzipped JSONL and Parquet: lines, rows, offsets and none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = make_docs(240, seed=4, max_words=40)
    root = tmp_path_factory.mktemp("trace-in")
    lines = []
    for i, d in enumerate(docs[:120]):
        lines.append(json.dumps({"id": i, "text": d}, ensure_ascii=False))
        if i % 13 == 2:
            lines.append("")  # blank lines are lines: the line numbers after them move on
    (root / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(root / "b.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs[120:180])
    pq.write_table(pa.table({"text": docs[180:]}), root / "c.parquet", row_group_size=25)
    return root


def pack(inputs: Path, out: Path, tokenizer: Path, *extra: str) -> dict:
    res = run_cli("pack-tokens", inputs, "-o", out, "--tokenizer", tokenizer, "--provenance", "--quiet",
                  "--shard-tokens", "1K", "--seq-len", str(SEQ), *extra)
    assert res.exit_code == 0, res.stderr
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def made(inputs: Path, bpe_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trace-out")
    pack(inputs, root / "plain", bpe_tokenizer, "--workers", "2")
    pack(inputs, root / "packed", bpe_tokenizer, "--workers", "2", "--pack", "best-fit", "--pack-window", "512",
         "--memory", "64MB")
    return {"plain": root / "plain", "packed": root / "packed"}


def record_text(inputs: Path, doc: dict) -> str:
    """The document's text, read here without shardsmith: its line, gzipped line or Parquet row."""
    import pyarrow.parquet as pq

    path = inputs / doc["input"]
    if doc["input"].endswith(".parquet"):
        assert doc["offset"] is None and doc["row"] == doc["record"] + 1
        return pq.read_table(path).column("text")[doc["record"]].as_py()
    if doc["input"].endswith(".gz"):
        assert doc["offset"] is None
        return json.loads(gzip.decompress(path.read_bytes()).split(b"\n")[doc["record"]])["text"]
    data = path.read_bytes()
    line = data.split(b"\n")[doc["record"]]
    assert doc["line"] == doc["record"] + 1 and data[doc["offset"]:].startswith(line + b"\n")
    return json.loads(line)["text"]


def doc_ids(out: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    m = json.loads((out / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    return tok.encode(text, add_special_tokens=False).ids + [m["tokenizer"]["eos_id"]]


def contains(ids: list[int], seg: list[int], *, step: int = 1) -> bool:
    return any(ids[k:k + len(seg)] == seg for k in range(0, max(1, len(ids) - len(seg) + 1), step))


def test_every_windows_documents_are_the_input_lines_of_its_tokens(made, inputs):
    ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
    seen = set()
    for i in range(len(ds)):
        x, y = ds[i]
        tokens = np.concatenate([x, y[-1:]]).tolist()
        docs = ds.sources(i)
        assert docs[0]["start"] == 0 and docs[-1]["stop"] == SEQ + 1
        for d in docs:
            ids, seg = doc_ids(made["plain"], record_text(inputs, d)), tokens[d["start"]:d["stop"]]
            if d["start"] > 0:
                assert ids[:len(seg)] == seg  # the document starts inside the window
            elif d["stop"] < SEQ + 1:
                assert ids[len(ids) - len(seg):] == seg  # it ends inside
            else:
                assert contains(ids, seg)
            seen.add((d["input"], d["record"]))
    assert {f for f, _ in seen} == {"a.jsonl", "b.jsonl.gz", "c.parquet"}


def test_every_packed_piece_is_a_piece_of_its_input_document(made, inputs):
    ds = PackedSequences(made["packed"])
    docs = 0
    for i in range(len(ds)):
        tokens = ds[i]["tokens"].tolist()
        for d in ds.sources(i):
            ids = doc_ids(made["packed"], record_text(inputs, d))
            assert contains(ids, tokens[d["start"]:d["stop"]], step=SEQ)  # pieces are cut every seq_len tokens
            docs += ids[:d["stop"] - d["start"]] == tokens[d["start"]:d["stop"]]
    assert docs == 240  # each document's first piece, once


def test_the_origins_do_not_depend_on_workers_or_memory(made, inputs, bpe_tokenizer, tmp_path):
    pack(inputs, tmp_path / "plain", bpe_tokenizer, "--workers", "1", "--memory", "8MB")
    pack(inputs, tmp_path / "packed", bpe_tokenizer, "--workers", "1", "--pack", "best-fit", "--pack-window", "512",
         "--memory", "32MB")
    for kind in ("plain", "packed"):
        assert tree_digest(tmp_path / kind) == tree_digest(made[kind])
        assert any(name.endswith(".origins.npy") for name in tree_digest(made[kind]))
        assert run_cli("verify", made[kind]).exit_code == 0
        assert "provenance" in run_cli("inspect", made[kind], "--samples", "0").output


def printed(output: str) -> list[tuple[int, int, str, str, int, str]]:
    """(start, stop, input, unit, number, text) of each document line ``trace`` printed."""
    found = re.findall(r"^  tokens (\d+):(\d+)  (\S+) (\w+) (\d+)(?: \(byte \d+\))?  (.*)$", output, re.M)
    return [(int(a), int(b), f, u, int(n), t) for a, b, f, u, n, t in found]


@pytest.mark.parametrize("kind", ["plain", "packed"])
def test_trace_prints_the_documents_with_their_text(made, inputs, kind):
    ds = shardsmith.TokenDataset(made[kind], seq_len=SEQ) if kind == "plain" else PackedSequences(made[kind])
    for i in (0, len(ds) // 2, len(ds) - 1):
        res = run_cli("trace", made[kind], str(i))
        assert res.exit_code == 0, res.stderr
        docs, lines = ds.sources(i), printed(res.output)
        assert len(lines) == len(docs) > 0
        for d, (a, b, f, unit, n, text) in zip(docs, lines):
            assert (a, b, f, n) == (d["start"], d["stop"], d["input"], d[unit])
            full = record_text(inputs, d)
            assert text == json.dumps(full[:80], ensure_ascii=False) + ("…" if len(full) > 80 else "")


def test_trace_says_changed_or_missing_never_a_traceback(made, inputs, tmp_path):
    moved = tmp_path / "inputs"
    shutil.copytree(inputs, moved)
    ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
    i = next(i for i in range(len(ds)) if len(names := {d["input"] for d in ds.sources(i)}) > 1 and "a.jsonl" in names)
    docs = ds.sources(i)
    same = printed(run_cli("trace", made["plain"], str(i), "--inputs", moved).output)
    assert all(not t.startswith(("changed", "missing")) for *_, t in same)
    a = moved / "a.jsonl"
    data = bytearray(a.read_bytes())
    for d in docs:  # the same bytes count, another text: only the hash tells
        if d["input"] == "a.jsonl":
            at = data.index(b"doc ", d["offset"])
            data[at:at + 3] = b"DOC"
    a.write_bytes(bytes(data))
    (moved / "c.parquet").unlink()
    with gzip.open(moved / "b.jsonl.gz", "ab") as fh:
        fh.write(b'{"text": "one more"}\n')  # another size
    res = run_cli("trace", made["plain"], str(i), "--inputs", moved)
    assert res.exit_code == 0 and "Traceback" not in res.output + res.stderr
    for d, (*_, text) in zip(docs, printed(res.output)):
        assert text.startswith({"a.jsonl": "changed", "c.parquet": "missing", "b.jsonl.gz": "changed"}[d["input"]])


def test_trace_refuses_in_one_line(made, tmp_path):
    for args, code, words in ((("trace", made["plain"]), 2, "INDEX"),
                              (("trace", made["plain"], "100000"), 2, "out of range"),
                              (("trace", made["plain"], "0", "--split", "val"), 2, "no split"),
                              (("trace", tmp_path, "0"), 1, "not a dataset"),
                              (("trace", made["plain"], "--state", tmp_path / "none.json"), 2, "cannot read")):
        res = run_cli(*args)
        assert res.exit_code == code and words in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


# -- from a saved loader state ---------------------------------------------------------------------

def saved_state(made: dict[str, Path], kind: str, tmp_path: Path, *, take: int | None, workers: int = 2):
    """A StatefulDataLoader as the README's loop makes it, ``take`` batches into epoch 0 (None: all
    of them), saved as that loop saves it; returns the state file, the dataset and the next batch."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardsmith.torch import EpochBatchSampler, PackedBatches, TokenBatches, TokenWindows

    if kind == "packed":
        ds = PackedSequences(made["packed"])
        make = lambda: StatefulDataLoader(PackedBatches(ds, batch_size=3, seed=2), batch_size=None,  # noqa: E731
                                          num_workers=workers)
    elif kind == "windows":
        ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
        make = lambda: StatefulDataLoader(TokenBatches(ds, batch_size=4, seed=1), batch_size=None,  # noqa: E731
                                          num_workers=workers)
    else:  # map-style, through our batch sampler
        ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
        make = lambda: StatefulDataLoader(TokenWindows(ds), num_workers=workers,  # noqa: E731
                                          batch_sampler=EpochBatchSampler(ds, batch_size=5, seed=3))
    loader = make()
    it = iter(loader)
    if take is None:
        for _ in it:
            pass
    else:
        for _ in range(take):
            next(it)
    state = {"epoch": 0, "loader": loader.state_dict()}
    path = tmp_path / "loader-rank0.json"
    path.write_text(json.dumps(state))
    if take is None:  # the loop goes on with the next epoch
        loader.dataset.set_epoch(1) if hasattr(loader.dataset, "set_epoch") else loader.batch_sampler.set_epoch(1)
        following = next(iter(loader))
    else:
        following = next(it)
    del it
    return path, ds, following


def traced_samples(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"^(?:window|sequence) (\d+):", output, re.M)]


@pytest.mark.parametrize("kind,take", [("windows", 3), ("packed", 2), ("sampler", 4), ("windows", None)])
def test_trace_state_names_the_batch_the_loader_yields_next(made, tmp_path, kind, take):
    path, ds, following = saved_state(made, kind, tmp_path, take=take)
    res = run_cli("trace", made["packed" if kind == "packed" else "plain"], "--state", path)
    assert res.exit_code == 0, res.stderr
    samples = traced_samples(res.output)
    assert f"epoch {0 if take else 1}" in res.output
    if kind == "packed":
        want = ds.get_varlen(samples)["tokens"]
        assert np.array_equal(following["tokens"].numpy(), want)
    else:
        x = following[0] if isinstance(following, (list, tuple)) else following
        assert np.array_equal(x.numpy(), ds.get_batch(np.array(samples))[0])
    assert len(printed(res.output)) >= len(samples) > 0


def test_trace_state_of_another_seq_len_is_refused(made, tmp_path):
    path, _, _ = saved_state(made, "windows", tmp_path, take=1, workers=0)
    res = run_cli("trace", made["plain"], "--state", path, "--seq-len", str(SEQ + 1))
    assert res.exit_code == 2 and "--seq-len" in res.stderr


@pytest.mark.parametrize("change", [{"length": 20_000_000_000}, {"order": "blocks:0"}, {"batch_size": 2.5},
                                    {"world_size": 0}, {"seed": "x"}, {"rank": -1}])
def test_a_crafted_state_is_one_line_and_builds_nothing_big(made, tmp_path, change):
    """A state that lies about its length, order or layout is refused before any epoch order is made."""
    import json

    path, _, _ = saved_state(made, "windows", tmp_path, take=1, workers=0)
    saved = json.loads(path.read_text())

    def patch(value):
        if isinstance(value, dict):
            if value.get("shardsmith") is not None:
                value.update(change)
            for v in value.values():
                patch(v)
        elif isinstance(value, list):
            for v in value:
                patch(v)

    patch(saved)
    path.write_text(json.dumps(saved))
    res = run_cli("trace", made["plain"], "--state", path)
    assert res.exit_code == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize("change", [{"input_dir": 5}, {"input_sizes": "x"}, {"text_field": ["x"]}])
def test_a_crafted_manifest_is_one_line(made, tmp_path, change):
    import json
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(made["plain"], out)
    m = json.loads((out / "manifest.json").read_text())
    m["source"].update(change)
    (out / "manifest.json").write_text(json.dumps(m))
    res = run_cli("trace", out, "0")
    assert res.exit_code != 0 and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
