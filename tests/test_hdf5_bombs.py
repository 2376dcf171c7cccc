"""A tiny HDF5 shard that declares 3e8 events: the loader and ``verify --deep`` refuse it from its
metadata, at once, before allocating or reading anything; real shards of every compression load."""

from __future__ import annotations

import json
import resource
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import root_data, run_cli, run_measured
from test_fuzz_readers import rehash

import shardsmith
from shardsmith.errors import DatasetError

CLAIM = 300_000_000


@pytest.fixture(scope="module")
def small_events(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bombs")
    out = {}
    for compression in ("none", "lzf", "gzip", "blosc"):
        res = run_cli("convert", root_data() / "uproot-HZZ.root", "-o", root / compression, "--to", "hdf5",
                      "--branches", "Jet_P*,NJet,MET_px", "--compression", compression, "-q")
        assert res.exit_code == 0, res.stderr
        out[compression] = root / compression
    return out


def _bomb(src: Path, dst: Path, *, chunked: bool) -> Path:
    """``src`` with its shard replaced by one that declares CLAIM events and stores none of them."""
    import h5py

    out = shutil.copytree(src, dst)
    m = json.loads((out / "manifest.json").read_text())
    shard = out / m["splits"]["train"]["shards"][0]["path"]
    with h5py.File(shard, "r") as f:
        attrs = {k: f.attrs[k] for k in f.attrs}
    shard.unlink()
    kw = {"chunks": (1 << 16,)} if chunked else {}
    with h5py.File(shard, "w", libver=("v108", "v114")) as f:
        for k, v in attrs.items():
            f.attrs[k] = v
        f.attrs["samples"] = CLAIM
        for name, field in m["schema"].items():
            if field.get("counter"):
                g = f.require_group(name)
                g.create_dataset("values", shape=(CLAIM,), dtype=field["dtype"], **kw)
                g.create_dataset("offsets", shape=(CLAIM + 1,), dtype="<i8", **kw)
            else:
                f.create_dataset(name, shape=(CLAIM, *field.get("shape", [])), dtype=field["dtype"],
                                 **({"chunks": (1 << 16, *field.get("shape", []))} if chunked else {}))
    assert shard.stat().st_size < 64 << 10
    m["splits"] = {"train": {**m["splits"]["train"], "samples": CLAIM,
                             "shards": [{**m["splits"]["train"]["shards"][0], "samples": CLAIM}]}}
    if "events" in m["splits"]["train"]:
        m["splits"]["train"]["events"] = CLAIM
    (out / "manifest.json").write_text(json.dumps(m))
    rehash(out)
    return out


@pytest.mark.parametrize("chunked", [True, False], ids=["chunks never written", "contiguous never allocated"])
def test_a_tiny_shard_declaring_3e8_events_is_refused_at_once(small_events, tmp_path, chunked):
    out = _bomb(small_events["gzip" if chunked else "none"], tmp_path / "bomb", chunked=chunked)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ev = shardsmith.open(out)
    with pytest.raises(DatasetError, match="train-000000.h5"):
        ev.get_batch(np.arange(10))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KB: nothing near 2.4 GB
    res, peak = run_measured("verify", out, "--deep")
    assert res.returncode == 1 and "FAIL" in res.stdout and "train-000000.h5" in res.stdout, res.stdout
    assert peak < 600_000, peak  # KB: the interpreter and its libraries, nothing near the 2.4 GB claimed


@pytest.mark.parametrize("compression", ["none", "lzf", "gzip", "blosc"])
def test_real_shards_of_every_compression_still_load(small_events, compression):
    out = small_events[compression]
    ev = shardsmith.open(out)
    assert len(ev.get_batch(np.arange(len(ev)))) == len(ev)
    assert run_cli("verify", out, "--deep").exit_code == 0


def test_a_second_offsets_dataset_declaring_3e8_rows_is_refused_at_once(small_events, tmp_path):
    """Members of one counter share one offsets dataset (a hard link); a crafted shard that gives a
    member its own, never written, of 3e8 rows is checked before it is read whole."""
    import h5py

    out = shutil.copytree(small_events["none"], tmp_path / "bomb")
    with h5py.File(out / "train-000000.h5", "a") as f:
        del f["Jet_Py/offsets"]
        f["Jet_Py"].create_dataset("offsets", shape=(CLAIM,), dtype="<i8", chunks=(1 << 16,))
    rehash(out)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DatasetError, match="Jet_Py/offsets"):
        shardsmith.open(out)[0]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KB
