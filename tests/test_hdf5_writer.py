"""HDF5Writer: self-describing event shards that h5py alone reads, rollover, determinism, compression."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.events import EventChunk, EventSchema, Field, encode
from shardsmith.core.ragged import starts_of
from shardsmith.errors import UsageError, install_hint
from shardsmith.formats.hdf5.writer import CHUNK_BYTES, HDF5Writer
from shardsmith.kit import manifest_io

SCHEMA = EventSchema((
    Field(name="run", dtype="<i8"),
    Field(name="pos", dtype="<f4", shape=(3,)),
    Field(name="flag", dtype="|b1"),
    Field(name="hit_t", dtype="<f4", counter="nhit"),
    Field(name="hit_ch", dtype="<i8", counter="nhit"),
    Field(name="hit_xyz", dtype="<f8", shape=(3,), counter="nhit"),
    Field(name="jet_pt", dtype="<f4", counter="njet"),
    Field(name="jet_good", dtype="|b1", counter="njet"),
))


def make_events(n: int, *, seed: int = 0, max_hits: int = 40) -> EventChunk:
    """Synthetic events: several counters, fixed shapes, bool/int64/float; many with 0 hits or jets."""
    rng = np.random.default_rng(seed)
    nhit = rng.integers(0, max_hits, n)
    nhit[rng.random(n) < 0.2] = 0
    njet = rng.integers(0, 4, n)
    off_h, off_j = starts_of(nhit), starts_of(njet)
    th, tj = int(off_h[-1]), int(off_j[-1])
    columns = {
        "run": np.arange(n, dtype=np.int64) * 1_000_003 - 7,
        "pos": rng.standard_normal((n, 3)).astype(np.float32),
        "flag": rng.random(n) < 0.5,
        "hit_t": rng.standard_normal(th).astype(np.float32),
        "hit_ch": rng.integers(-(2**62), 2**62, th),
        "hit_xyz": rng.standard_normal((th, 3)),
        "jet_pt": rng.exponential(30, tj).astype(np.float32),
        "jet_good": rng.random(tj) < 0.7,
    }
    return EventChunk(first=0, n=n, columns=columns, offsets={"nhit": off_h, "njet": off_j})


def write_split(out: Path, split: str, chunk: EventChunk, *, schema: EventSchema = SCHEMA,
                shard_samples: int | None = None, shard_bytes: int = 1 << 30, compression: str = "none",
                batch_sizes: list[int] | None = None, seed: int = 0) -> list[dict]:
    """Encode the events and feed them to an HDF5Writer in batches of random (or given) sizes."""
    lengths, payload = encode(chunk, schema)
    starts = starts_of(lengths)
    writer = HDF5Writer(out_dir=out, split=split, schema=schema, shard_samples=shard_samples,
                        shard_bytes=shard_bytes, compression=compression)
    rng = np.random.default_rng(seed)
    i = 0
    sizes = iter(batch_sizes or [])
    while i < chunk.n:
        b = next(sizes, None) or int(rng.integers(1, 60))
        j = min(chunk.n, i + b)
        writer.write_batch(lengths[i:j], memoryview(payload[starts[i]:starts[j]]))
        i = j
    return [s.to_json() for s in writer.close()]


def write_dataset(out: Path, splits: dict[str, EventChunk], **kwargs) -> Path:
    """A finished hdf5 dataset: shards of every split plus manifest.json."""
    out.mkdir(parents=True, exist_ok=True)
    schema = kwargs.get("schema", SCHEMA)
    recorded = {}
    for name, chunk in splits.items():
        shards = write_split(out, name, chunk, **kwargs)
        recorded[name] = {"samples": sum(s["samples"] for s in shards), "shards": shards}
    manifest = manifest_mod.new_manifest(fmt="hdf5", seed=0, shuffle=False, source={"reader": "synthetic"},
                                         schema=schema.to_json(), splits=recorded,
                                         compression=kwargs.get("compression", "none"))
    manifest_io.save(out, manifest)
    return out


def read_with_h5py_only(path: Path) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """What a user without shardsmith does: root attributes say the layout."""
    with h5py.File(path, "r") as f:
        schema = json.loads(f.attrs["schema"])
        counters = json.loads(f.attrs["counters"])
        n = int(f.attrs["samples"])
        data, offsets = {}, {}
        for name, spec in schema.items():
            if spec["ragged"]:
                data[name] = f[name]["values"][...]
                offsets[name] = f[name]["offsets"][...]
                assert f[name]["offsets"] == f["_counters"][spec["counter"]]  # one array, hard-linked
                assert name in counters[spec["counter"]]
            else:
                data[name] = f[name][...]
                assert len(data[name]) == n
    return schema, data, offsets


def test_h5py_alone_reads_every_value(tmp_path):
    chunk = make_events(300, seed=1)
    shards = write_split(tmp_path, "train", chunk, shard_samples=128)
    assert [s["samples"] for s in shards] == [128, 128, 44]
    assert [s["path"] for s in shards] == ["train-000000.h5", "train-000001.h5", "train-000002.h5"]
    first = 0
    for s in shards:
        path = tmp_path / s["path"]
        assert s["bytes"] == path.stat().st_size
        assert s["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        schema, data, offsets = read_with_h5py_only(path)
        assert schema == SCHEMA.to_json()
        for k in range(s["samples"]):
            want = chunk.event(first + k, SCHEMA)
            for name, spec in schema.items():
                got = data[name][offsets[name][k]:offsets[name][k + 1]] if spec["ragged"] else data[name][k]
                assert got.dtype == want[name].dtype and np.array_equal(got, want[name]), (name, first + k)
        first += s["samples"]
    with h5py.File(tmp_path / shards[0]["path"], "r") as f:
        assert f.attrs["format"] == "shardsmith-events" and f.attrs["format_version"] == 1
        assert f.attrs["shardsmith_version"] and "offsets" in f.attrs["layout"]
        assert f["run"].chunks is None  # uncompressed: contiguous, so the loader can map it
    # libver pinned to v1.8..v1.14: superblock version 2 (HDF5 2.x with libver "latest" writes 3)
    assert (tmp_path / shards[0]["path"]).read_bytes()[8] == 2
    assert not list(tmp_path.glob(".*tmp*"))


def test_bytes_do_not_depend_on_batching(tmp_path):
    chunk = make_events(257, seed=2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_split(tmp_path / "a", "train", chunk, shard_samples=100, batch_sizes=[257])
    b = write_split(tmp_path / "b", "train", chunk, shard_samples=100, seed=5)
    assert a == b
    assert [s["samples"] for s in a] == [100, 100, 57]


def test_sorted_and_mapped_batches_write_the_same_bytes(tmp_path):
    """The gather's two ways in (``write_sorted``: records anywhere in one payload; ``write_mapped``:
    records in several payloads, as in the part files' mapped pages) write what ``write_batch`` of
    the records back to back writes: the ragged values are copied straight into the shard."""
    from shardsmith.kit.batches import MappedBatch, SortedBatch

    chunk = make_events(257, seed=4)
    lengths, payload = encode(chunk, SCHEMA)
    starts = starts_of(lengths)[:-1]
    rng = np.random.default_rng(0)
    got = {}
    for way in ("batch", "sorted", "mapped"):
        (tmp_path / way).mkdir()
        w = HDF5Writer(out_dir=tmp_path / way, split="train", schema=SCHEMA, shard_samples=100, shard_bytes=1 << 30)
        for a, b in ((0, 90), (90, 91), (91, 257)):
            idx = np.arange(a, b)
            if way == "batch":
                w.write_batch(lengths[idx], memoryview(payload[starts[a]:starts[b] if b < 257 else None]))
                continue
            where = rng.permutation(len(idx))  # the records stored in another order than they are written
            stored = np.concatenate([payload[starts[i]:starts[i] + lengths[i]] for i in idx[where]])
            at = np.empty(len(idx), dtype=np.int64)
            at[where] = starts_of(lengths[idx[where]])[:-1]
            if way == "sorted":
                w.write_sorted(SortedBatch(lengths=lengths[idx], source=stored, starts=at))
            else:  # the same records split between two sources
                cut = int(starts_of(lengths[idx[where]])[len(idx) // 2])
                src = (at >= cut).astype(np.int64)
                w.write_mapped(MappedBatch(lengths=lengths[idx], sources=[stored[:cut], stored[cut:].copy()],
                                           src=src, starts=at - cut * src))
        got[way] = [s.to_json() for s in w.close()]
    assert got["batch"] == got["sorted"] == got["mapped"]
    assert [s["samples"] for s in got["mapped"]] == [100, 100, 57]


@contextlib.contextmanager
def frames_held() -> Iterator[list]:
    """Every frame that returns meanwhile, held until the end: what a sampling profiler that never
    lets go of a sample does (``distributed.profile`` holds the running task's stack for a moment)."""
    held: list = []
    before = sys.getprofile()
    sys.setprofile(lambda frame, event, arg: held.append(frame) if event == "return" else None)
    try:
        yield held
    finally:
        sys.setprofile(before)


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_frames_held_by_a_profiler_change_no_byte(tmp_path, compression):
    """A Dask worker samples its task's stack every 10 ms: for a moment it holds the frames of the
    running writer, and with them the h5py datasets they name, after the writer is done with them.
    A compressed dataset writes its cached chunks, and HDF5 gives them their place in the file, when
    it closes: left to its last reference, its close came later whenever a sample held it, and the
    shard's bytes differed from a local run's (8 of 17 Dask runs). Held to the end here: the same bytes."""
    chunk = make_events(800, seed=7)
    (tmp_path / "free").mkdir()
    (tmp_path / "held").mkdir()
    free = write_split(tmp_path / "free", "train", chunk, shard_samples=300, compression=compression)
    with frames_held() as held:
        got = write_split(tmp_path / "held", "train", chunk, shard_samples=300, compression=compression)
    assert len(held) > 100  # the writer's and h5py's frames were held
    assert got == free


def test_rollover_by_bytes_and_an_event_larger_than_a_shard(tmp_path):
    chunk = make_events(200, seed=3)
    writer_bytes, _ = encode(chunk, SCHEMA)  # shards hold at most shard_bytes of event records
    limit = 6000
    shards = write_split(tmp_path, "train", chunk, shard_bytes=limit)
    at = 0
    for s in shards:
        size = int(writer_bytes[at:at + s["samples"]].sum())
        assert size <= limit or s["samples"] == 1
        if at + s["samples"] < chunk.n:  # full: the next event would not have fit
            assert size + writer_bytes[at + s["samples"]] > limit
        at += s["samples"]
    assert at == chunk.n and len(shards) > 3
    tiny = write_split(tmp_path, "tiny", chunk, shard_bytes=1)
    assert [s["samples"] for s in tiny] == [1] * chunk.n


def test_empty_split_writes_no_shard(tmp_path):
    writer = HDF5Writer(out_dir=tmp_path, split="val", schema=SCHEMA, shard_samples=None, shard_bytes=1 << 20)
    writer.write_batch(np.zeros(0, np.int64), memoryview(b""))
    assert writer.close() == []
    assert list(tmp_path.iterdir()) == []


def test_events_without_hits_and_fixed_only_schema(tmp_path):
    chunk = make_events(50, seed=4, max_hits=1)  # no hit at all
    chunk.offsets["njet"][:] = 0
    for name in ("jet_pt", "jet_good"):
        chunk.columns[name] = chunk.columns[name][:0]
    assert chunk.offsets["nhit"][-1] == 0
    (shard,) = write_split(tmp_path, "train", chunk, compression="gzip")
    _, data, offsets = read_with_h5py_only(tmp_path / shard["path"])
    assert data["hit_t"].shape == (0,) and data["hit_xyz"].shape == (0, 3)
    assert np.array_equal(offsets["jet_pt"], np.zeros(51))
    fixed = EventSchema((Field(name="e", dtype="<f8"),))
    only = EventChunk(first=0, n=10, columns={"e": np.arange(10.0)})
    (shard,) = write_split(tmp_path, "fixed", only, schema=fixed)
    with h5py.File(tmp_path / shard["path"], "r") as f:
        assert np.array_equal(f["e"][...], np.arange(10.0)) and "_counters" not in f


@pytest.mark.parametrize("compression", ["lzf", "gzip"])
def test_compressed_shards_are_chunked_for_window_reads(tmp_path, compression):
    chunk = make_events(3000, seed=5)
    (shard,) = write_split(tmp_path, "train", chunk, compression=compression)
    path = tmp_path / shard["path"]
    _, data, offsets = read_with_h5py_only(path)
    assert np.array_equal(data["hit_xyz"], chunk.columns["hit_xyz"])
    assert np.array_equal(offsets["hit_t"], chunk.offsets["nhit"])
    with h5py.File(path, "r") as f:
        values = f["hit_ch"]["values"]
        assert values.compression == compression and values.shuffle
        chunk_bytes = np.prod(values.chunks) * values.dtype.itemsize
        assert 64 << 10 <= chunk_bytes <= CHUNK_BYTES <= 256 << 10
    (tmp_path / "plain").mkdir()
    plain = write_split(tmp_path / "plain", "train", chunk)
    assert shard["bytes"] < plain[0]["bytes"]


def test_blosc_needs_hdf5plugin(tmp_path, monkeypatch):
    try:
        import hdf5plugin  # noqa: F401
    except ImportError:
        pass
    else:
        chunk = make_events(500, seed=6)
        (shard,) = write_split(tmp_path, "train", chunk, compression="blosc")
        _, data, _ = read_with_h5py_only(tmp_path / shard["path"])
        assert np.array_equal(data["hit_t"], chunk.columns["hit_t"])
    real_import = builtins.__import__

    def no_plugin(name, *args, **kwargs):
        if name == "hdf5plugin":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_plugin)
    with pytest.raises(UsageError, match=re.escape(install_hint("blosc"))):
        HDF5Writer(out_dir=tmp_path, split="t", schema=SCHEMA, shard_samples=None, shard_bytes=1,
                   compression="blosc")


def test_bad_options_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="choose one of"):
        HDF5Writer(out_dir=tmp_path, split="t", schema=SCHEMA, shard_samples=None, shard_bytes=1,
                   compression="zstd")
    bad = EventSchema((Field(name="a/b", dtype="<f4"),))
    with pytest.raises(UsageError, match="'a/b'"):
        HDF5Writer(out_dir=tmp_path, split="t", schema=bad, shard_samples=None, shard_bytes=1)


def test_abort_leaves_no_temporary_file(tmp_path, monkeypatch):
    chunk = make_events(100, seed=7)
    lengths, payload = encode(chunk, SCHEMA)
    writer = HDF5Writer(out_dir=tmp_path, split="train", schema=SCHEMA, shard_samples=40, shard_bytes=1 << 30)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    writer.write_batch(lengths[:50], memoryview(payload[:int(lengths[:50].sum())]))
    monkeypatch.setattr("shardsmith.formats.hdf5.writer._commit", boom)
    with pytest.raises(OSError, match="disk full"):
        writer.write_batch(lengths[50:], memoryview(payload[int(lengths[:50].sum()):]))
        writer.close()
    writer.abort()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["train-000000.h5"]  # the first shard was whole; nothing half-written remains
