"""A dataset rewritten (``--overwrite``) while a loader has it open: the loader serves the dataset it
opened, whole, or raises a DatasetError at the next read; never shards of the new conversion."""

from __future__ import annotations

import os
import pickle

import pytest
from conftest import root_data, run_cli, two_file_corpus

import shardsmith
from shardsmith.errors import DatasetError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    return two_file_corpus(tmp_path_factory.mktemp("replaced"), 600, seed=2, max_words=30, first=300)


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "shape"):
        return a.shape == b.shape and bool((a == b).all())
    return a == b


def _rewrite(args: list, seed: str) -> None:
    res = run_cli(*args, "--seed", seed, "--overwrite", "-q")
    assert res.exit_code == 0, res.stderr


def test_tokens(corpus, bpe_tokenizer, tmp_path):
    args = ["pack-tokens", corpus, "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "--shard-tokens", "3K",
            "--seq-len", "32"]
    _rewrite(args, "1")
    untouched = shardsmith.TokenDataset(tmp_path / "o")
    docs = shardsmith.open(tmp_path / "o")
    assert len(untouched._shards.paths) > 2
    read = shardsmith.TokenDataset(tmp_path / "o")
    before = read[len(read) - 1]  # maps every shard
    _rewrite(args, "2")
    with pytest.raises(DatasetError, match="changed since the dataset was opened"):
        untouched[0]
    with pytest.raises(DatasetError, match="changed since the dataset was opened"):
        docs[0]  # its .idx files were read lazily
    assert _same(read[len(read) - 1], before)  # the old files stay whole while mapped


def test_tar_shards(corpus, tmp_path):
    args = ["convert", corpus, "-o", tmp_path / "o", "--to", "webdataset", "--shard-samples", "100"]
    _rewrite(args, "1")
    ds = shardsmith.open(tmp_path / "o")
    first = ds[0]
    _rewrite(args, "2")
    with pytest.raises(DatasetError, match="changed since the dataset was opened"):
        ds[len(ds) - 1]  # another shard, opened after the rewrite
    assert _same(ds[0], first)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_event_shards(tmp_path, compression):
    hzz = root_data() / "uproot-HZZ.root"
    args = ["convert", hzz, "-o", tmp_path / "o", "--to", "hdf5", "--branches", "Jet_P*,NJet,MET_px",
            "--shard-samples", "800", "--compression", compression]
    _rewrite(args, "1")
    ev = shardsmith.open(tmp_path / "o")
    first = ev[0]
    _rewrite(args, "2")
    with pytest.raises(DatasetError, match="changed since the dataset was opened"):
        ev[len(ev) - 1]
    assert _same(ev[0], first)


def test_plain_h5py_opens_a_shard_the_loader_has_open(tmp_path):
    import h5py

    out = tmp_path / "o"
    res = run_cli("convert", root_data() / "uproot-HZZ.root", "-o", out, "--to", "hdf5", "--branches", "Jet_P*,NJet",
                  "--compression", "gzip", "-q")
    assert res.exit_code == 0, res.stderr
    ev = shardsmith.open(out)
    ev[0]  # the loader holds the compressed shard open through h5py
    with h5py.File(out / "train-000000.h5", "r") as f:  # failed with a file-locking flag clash
        assert f.attrs["samples"] == len(ev)


def _in_fork(read) -> str:
    """What ``read()`` does in a forked child (a DataLoader worker started by fork)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's outcome is its exit status
        code = 3
        try:
            read()
            code = 1
        except DatasetError as exc:
            code = 0 if "changed since the dataset was opened" in str(exc) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {0: "refused", 1: "served", 2: "other error"}.get(os.waitstatus_to_exitcode(status), "crashed")


@pytest.mark.parametrize("kind", ["tokens", "tar", "hdf5"])
def test_pickled_and_forked_copies_check_too(corpus, bpe_tokenizer, tmp_path, kind):
    """A spawned DataLoader worker gets a pickled copy, a forked one a copy of the process: both
    open their own shards, and both refuse files replaced since the dataset was made."""
    out = tmp_path / "o"
    args = {"tokens": ["pack-tokens", corpus, "-o", out, "--tokenizer", bpe_tokenizer, "--shard-tokens", "3K",
                       "--seq-len", "32"],
            "tar": ["convert", corpus, "-o", out, "--to", "webdataset", "--shard-samples", "100"],
            "hdf5": ["convert", root_data() / "uproot-HZZ.root", "-o", out, "--to", "hdf5", "--branches",
                     "Jet_P*,NJet", "--shard-samples", "800", "--compression", "gzip"]}[kind]
    _rewrite(args, "1")
    ds = shardsmith.TokenDataset(out) if kind == "tokens" else shardsmith.open(out)
    ds[0]
    blob = pickle.dumps(ds)
    shard_bytes = sum(e["bytes"] for e in ds.manifest["splits"]["train"]["shards"])
    assert len(blob) < shard_bytes / 2  # open maps are not pickled (a map pickles as a copy of its data)
    _rewrite(args, "2")
    with pytest.raises(DatasetError, match="changed since the dataset was opened"):
        pickle.loads(blob)[len(ds) - 1]
    assert _in_fork(lambda: ds[len(ds) - 1]) == "refused"
