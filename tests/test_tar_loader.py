"""TarDataset: exact fields by random access, the same bytes through webdataset, wids and tarfile,
rank splits, exact resume, decoders that never unpickle, and a loader that trusts no file."""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import pickle
import shutil
import tarfile
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
from conftest import member_table, tar_archive
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardsmith
from shardsmith.core import manifest
from shardsmith.errors import DatasetError
from shardsmith.formats.webdataset import dataset as dataset_module
from shardsmith.formats.webdataset.sample_walk import SampleIterator
from shardsmith.formats.webdataset.tarfmt import BLOCK, parse_members
from shardsmith.kit import manifest_io
from shardsmith.kit.order import epoch_order
from shardsmith.loader import TarDataset

Fields = list[tuple[str, bytes]]


class Boom:
    """Unpickling a .pyd member that holds this would raise: the loader must hand back its bytes."""

    def __reduce__(self) -> tuple:
        return (exec, ("raise SystemExit('unpickled!')",))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def jpeg(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (i * 10 % 256, 100, 200)).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def make_samples(n: int, prefix: str) -> list[tuple[str, Fields]]:
    return [(f"{prefix}{i:05d}", [("jpg", jpeg(i)), ("cls", b"%d" % (i % 3)), ("json", orjson.dumps({"i": i, "s": "ü"})),
                                  ("txt", f"sample {i} 東京".encode()), ("npy", npy_bytes(np.arange(i, dtype=np.float32))),
                                  ("pyd", pickle.dumps(Boom()))])
            for i in range(n)]


def write_split(out: Path, split: str, samples: list[tuple[str, Fields]], per_shard: int) -> dict[str, Any]:
    """Shards and offset indexes as the webdataset writer laid them out before the index folder (each
    index beside its shard, version 1): the loader follows the manifest's paths. Returns the
    manifest's split entry."""
    entries = []
    for s, first in enumerate(range(0, len(samples), per_shard)):
        archive, offsets = tar_archive(samples[first:first + per_shard])
        tar, idx = out / f"{split}-{s:06d}.tar", out / f"{split}-{s:06d}.offsets.npy"
        tar.write_bytes(archive)
        np.save(idx, np.array(offsets, dtype=np.int64))
        entries.append({"path": tar.name, "samples": len(offsets) - 1, "bytes": tar.stat().st_size,
                        "sha256": sha256(tar),
                        "index": {"path": idx.name, "bytes": idx.stat().st_size, "sha256": sha256(idx)}})
    return {"samples": len(samples), "shards": entries}


def write_dataset(out: Path, splits: dict[str, list[tuple[str, Fields]]], *, per_shard: int = 10) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    schema = {"jpg": {"kind": "image"}, "cls": {"kind": "int"}, "json": {"kind": "json"}, "txt": {"kind": "text"},
              "npy": {"kind": "npy"}, "pyd": {"kind": "bytes"}}
    m = manifest.new_manifest(fmt="webdataset", seed=0, shuffle=True, source={"reader": "test", "inputs": []},
                              schema=schema, classes=["a", "b", "c"],
                              splits={name: write_split(out, name, s, per_shard) for name, s in splits.items()})
    manifest_io.save(out, m)
    return out


TRAIN = make_samples(25, "t")
VAL = make_samples(4, "v")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("tar") / "out", {"train": TRAIN, "val": VAL})


def check_sample(got: dict[str, Any], key: str, fields: Fields) -> None:
    raw = dict(fields)
    assert got["__key__"] == key and set(got) == {"__key__", *raw}
    assert got["jpg"] == raw["jpg"] and got["pyd"] == raw["pyd"] and isinstance(got["pyd"], bytes)
    assert got["cls"] == int(raw["cls"]) and got["json"] == orjson.loads(raw["json"])
    assert got["txt"] == raw["txt"].decode()
    assert np.array_equal(got["npy"], np.load(io.BytesIO(raw["npy"]))) and got["npy"].dtype == np.float32


def test_random_access_returns_exact_fields(dataset):
    ds = shardsmith.open(dataset)
    assert isinstance(ds, TarDataset) and len(ds) == 25 and ds.classes == ["a", "b", "c"]
    assert [p.name for p in ds.shard_paths] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert all(p.is_absolute() for p in ds.shard_paths)
    for i in np.random.default_rng(0).permutation(25):
        check_sample(ds[int(i)], *TRAIN[i])
    check_sample(ds[-1], *TRAIN[-1])
    check_sample(shardsmith.open(dataset, split="val")[3], *VAL[3])
    for bad in (25, -26):
        with pytest.raises(IndexError):
            ds[bad]


def test_iteration_equals_random_access(dataset):
    ds = TarDataset(dataset)
    assert [s["__key__"] for s in ds.iter(shuffle=False)] == [k for k, _ in TRAIN]
    shuffled = [s["__key__"] for s in ds.iter(shuffle=True, seed=5, epoch=1)]
    order = epoch_order(25, shuffle=True, seed=5, epoch=1)
    assert shuffled == [TRAIN[i][0] for i in order] and sorted(shuffled) == [k for k, _ in TRAIN]
    batches = list(ds.iter(shuffle=True, seed=5, epoch=1, batch_size=4))
    assert [len(b) for b in batches] == [4] * 6 + [1]
    assert [s["__key__"] for b in batches for s in b] == shuffled
    got = ds.get_batch([3, 0, 3])
    assert [s["__key__"] for s in got] == [TRAIN[3][0], TRAIN[0][0], TRAIN[3][0]]


def test_rank_split_and_exact_resume(dataset):
    ds = TarDataset(dataset)
    per_rank = [[s["__key__"] for s in ds.iter(seed=2, epoch=3, rank=r, world_size=3)] for r in range(3)]
    keys = [k for part in per_rank for k in part]
    assert [len(p) for p in per_rank] == [8, 8, 8] and len(set(keys)) == 24
    full = [[s["__key__"] for s in b] for b in ds.iter(seed=1, epoch=2, rank=1, world_size=2, batch_size=3)]
    it = ds.iter(seed=1, epoch=2, rank=1, world_size=2, batch_size=3)
    head = [[s["__key__"] for s in next(it)] for _ in range(2)]
    state = json.loads(json.dumps(it.state_dict()))
    again = ds.iter(seed=1, epoch=2, rank=1, world_size=2, batch_size=3)
    again.load_state_dict(state)
    assert head + [[s["__key__"] for s in b] for b in again] == full
    with pytest.raises(ValueError):
        ds.iter(seed=9, epoch=2, rank=1, world_size=2, batch_size=3).load_state_dict(state)


def test_sample_iteration_slices_ahead_exactly(tmp_path, monkeypatch):
    """iter() one sample at a time slices a block of samples ahead: a member that does not decode
    raises at its own sample (after the ones before it), a resume lands inside a block, and shards
    whose samples differ in members are read sample by sample, in the same order."""
    samples = make_samples(40, "m")
    samples[30] = (samples[30][0], [("cls", b"junk") if k == "cls" else (k, v) for k, v in samples[30][1]])
    ds = TarDataset(write_dataset(tmp_path / "bad", {"train": samples}))
    order = epoch_order(40, shuffle=True, seed=1, epoch=0)
    bad = int(np.flatnonzero(order == 30)[0])
    it = ds.iter(seed=1)
    assert [next(it)["__key__"] for _ in range(bad)] == [samples[i][0] for i in order[:bad]]
    with pytest.raises(DatasetError, match=r"member \.cls at byte"):
        next(it)
    it = ds.iter(seed=1, shuffle=False)
    state = [next(it) for _ in range(5)] and it.state_dict()
    again = ds.iter(seed=1, shuffle=False)
    again.load_state_dict(state)
    assert next(again)["__key__"] == samples[5][0]
    monkeypatch.setattr(SampleIterator, "_BLOCK_BYTES", 1)  # a block of one sample each
    it = ds.iter(seed=1, shuffle=False)
    assert [next(it)["__key__"] for _ in range(30)] == [k for k, _ in samples[:30]]
    mixed = make_samples(12, "x")
    mixed[3] = (mixed[3][0], mixed[3][1][:2])
    ds = TarDataset(write_dataset(tmp_path / "mixed", {"train": mixed}, per_shard=5))
    assert [s["__key__"] for s in ds.iter(seed=2)] == [mixed[i][0] for i in epoch_order(12, shuffle=True, seed=2,
                                                                                              epoch=0)]
    assert set(ds[3]) == {"__key__", "jpg", "cls"}


class _CountedMap(mmap.mmap):
    """A real map of the shard that counts the looks at its file's size (``identity.intact``)."""

    looks = 0

    def size(self) -> int:
        type(self).looks += 1
        return super().size()


def test_a_batch_looks_at_each_shard_once(dataset, tmp_path, monkeypatch):
    """Issue 44 item 5: ``read`` (a batch: ``get_batch``, ``iter(batch_size=)``, the adapters) looked at
    the file's size before every sample (one fstat each, a third of a small sample's cost); it looks
    once per shard and batch now, still before the first byte of it is read. ``ds[i]`` looks each time."""
    monkeypatch.setattr(dataset_module, "mmap", SimpleNamespace(mmap=_CountedMap, ACCESS_READ=mmap.ACCESS_READ))
    ds = TarDataset(dataset)
    ds.read([0, 10, 20])  # every shard mapped
    _CountedMap.looks = 0
    batch = ds.read([3, 4, 13, 5, 14, 24, -1])  # shards 0, 0, 1, 0, 1, 2, 2 (10 samples a shard)
    assert [b["__key__"] for b in batch] == [TRAIN[i][0] for i in (3, 4, 13, 5, 14, 24, 24)]
    assert _CountedMap.looks == 3
    _CountedMap.looks = 0
    for i in (3, 4, 13):
        ds[i]
    assert _CountedMap.looks == 3
    with pytest.raises(IndexError):
        ds.read([1, 25])
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    ds = TarDataset(copy)
    ds.read([0, 10])
    os.truncate(copy / "train-000001.tar", 0)  # by another program, while it is mapped
    assert [b["__key__"] for b in ds.read([1, 2])] == [TRAIN[1][0], TRAIN[2][0]]
    with pytest.raises(DatasetError, match="truncated to 0 of its"):
        ds.read([1, 11])


def test_decode_modes(dataset):
    img = TarDataset(dataset, decode="pil")[2]["jpg"]
    assert img.size == (8, 6) and img.mode == "RGB"
    arr = TarDataset(dataset, decode="numpy")[2]["jpg"]
    assert arr.shape == (6, 8, 3) and arr.dtype == np.uint8 and abs(int(arr[3, 4, 2]) - 200) < 8
    assert isinstance(TarDataset(dataset)[2]["jpg"], bytes)
    with pytest.raises(ValueError):
        TarDataset(dataset, decode="cv2")


def test_webdataset_reads_every_sample(dataset):
    ds = TarDataset(dataset)
    got = list(ds.webdataset())
    assert len(got) == 25
    for sample, (key, fields) in zip(got, TRAIN):
        assert sample["__key__"] == key and {k: sample[k] for k, _ in fields} == dict(fields)
    decoded = next(iter(ds.webdataset(decode="pil")))
    assert decoded["cls"] == 0 and decoded["json"] == {"i": 0, "s": "ü"} and decoded["jpg"].size == (8, 6)
    assert decoded["pyd"] == dict(TRAIN[0][1])["pyd"]  # webdataset's own decoders would unpickle this


def test_wids_reads_every_sample(dataset, tmp_path):
    wids = pytest.importorskip("wids")
    ds = TarDataset(dataset)
    entries = ds.manifest["splits"]["train"]["shards"]
    spec = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "train",
            "shardlist": [{"url": e["path"], "nsamples": e["samples"], "filesize": e["bytes"]} for e in entries]}
    (dataset / "train.wids.json").write_text(json.dumps(spec))
    wd = wids.ShardListDataset(str(dataset / "train.wids.json"), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(wd) == 25
    for i, (key, fields) in enumerate(TRAIN):
        sample = wd[i]
        assert sample["__key__"] == key and {k: sample["." + k].getvalue() for k, _ in fields} == dict(fields)
    wd.close()


def test_tarfile_reads_every_member(dataset):
    members = []
    for path in TarDataset(dataset).shard_paths:
        with tarfile.open(path) as tf:
            members += [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    assert members == [(f"{k}.{e}", d) for k, fields in TRAIN for e, d in fields]


def test_torch_adapters_split_without_duplicates(dataset):
    torch = pytest.importorskip("torch")
    from shardsmith.torch import TarIterable, TarSamples

    ds = TarDataset(dataset)
    batches = list(torch.utils.data.DataLoader(TarSamples(ds), batch_size=4, collate_fn=list))
    assert [s["__key__"] for b in batches for s in b] == [k for k, _ in TRAIN]
    seen = []
    for rank in range(2):
        it = TarIterable(pickle.loads(pickle.dumps(ds)), seed=3, rank=rank, world_size=2)
        it.set_epoch(4)
        dl = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2 if rank == 0 else 0)
        seen += [s["__key__"] for s in dl]
    order = epoch_order(25, shuffle=True, seed=3, epoch=4, world_size=1)
    assert len(seen) == len(set(seen)) == 24 and set(seen) <= {TRAIN[i][0] for i in order}
    batched = list(TarIterable(ds, batch_size=5, rank=0, world_size=1))
    assert [len(b) for b in batched] == [5] * 5


# -- safety: paths, pickles, corrupt files ------------------------------------------------------


def copy_dataset(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite_manifest(out: Path, edit) -> None:
    """Change manifest.json in place, bypassing ``save``'s validation (as an attacker would)."""
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))  # json: writes ints beyond 64 bits too


@pytest.mark.parametrize("path", ["../outside.tar", "/etc/passwd", "sub/../../x.tar", "", "a\\b.tar"])
def test_paths_leading_outside_are_refused(dataset, tmp_path, path):
    out = copy_dataset(dataset, tmp_path / "ds")
    rewrite_manifest(out, lambda m: m["splits"]["train"]["shards"][0].update(path=path))
    with pytest.raises(DatasetError, match="refusing path|not a plain relative path"):
        TarDataset(out)
    out2 = copy_dataset(dataset, tmp_path / "ds2")
    rewrite_manifest(out2, lambda m: m["splits"]["train"]["shards"][1]["index"].update(path=path))
    with pytest.raises(DatasetError):
        TarDataset(out2)


@pytest.mark.parametrize("name", ["train-000001.tar", "train-000001.offsets.npy"])
def test_symlinks_leading_outside_are_refused(dataset, tmp_path, name):
    out = copy_dataset(dataset, tmp_path / "ds")
    outside = tmp_path / name
    shutil.move(out / name, outside)
    (out / name).symlink_to(outside)
    with pytest.raises(DatasetError, match="leads outside"):
        TarDataset(out)


def test_unsafe_or_incomplete_datasets_are_refused(dataset, tmp_path):
    out = copy_dataset(dataset, tmp_path / "ds")
    with pytest.raises(DatasetError, match="no split"):
        TarDataset(out, split="test")
    rewrite_manifest(out, lambda m: m["splits"]["train"]["shards"][0].pop("index"))
    with pytest.raises(DatasetError, match="no offset index"):
        TarDataset(out)
    (out / "manifest.json").unlink()
    with pytest.raises(DatasetError, match="no manifest.json"):
        TarDataset(out)


def test_pickled_offsets_are_never_loaded(dataset, tmp_path):
    out = copy_dataset(dataset, tmp_path / "ds")
    idx = out / "train-000000.offsets.npy"
    np.save(idx, np.array([Boom()] * 11, dtype=object), allow_pickle=True)
    rewrite_manifest(out, lambda m: m["splits"]["train"]["shards"][0]["index"].update(bytes=idx.stat().st_size))
    with pytest.raises(DatasetError, match="pickles"):
        TarDataset(out)


def test_an_index_that_cuts_a_sample_is_caught(dataset, tmp_path):
    out = copy_dataset(dataset, tmp_path / "ds")
    idx = out / "train-000000.offsets.npy"
    offsets = np.load(idx)
    offsets[1] = parse_members((out / "train-000000.tar").read_bytes(), 0, int(offsets[1]))[1][1] - BLOCK
    np.save(idx, offsets)  # sample 0 ends after its first member; sample 1 starts inside sample 0
    ds = TarDataset(out)
    # a shard is parsed and validated whole on first use: a bad index refuses every sample of it
    for i in (0, 1, 2):
        with pytest.raises(DatasetError, match="inside the sample"):
            ds[i]


def test_datasets_pickle_for_spawned_workers(dataset):
    ds = TarDataset(dataset, decode="pil")
    first = ds[0]["jpg"]
    again = pickle.loads(pickle.dumps(ds))
    assert again[0]["jpg"].tobytes() == first.tobytes() and len(again) == 25


def check_everything_or_dataset_error(out: Path, decode: str | None = None) -> None:
    """Open and read every sample: each step may raise DatasetError, and nothing else."""
    try:
        ds = TarDataset(out, decode=decode)
    except DatasetError:
        return
    for i in range(len(ds)):
        try:
            sample = ds[i]
        except DatasetError:
            continue
        assert isinstance(sample, dict) and "__key__" in sample


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


@FUZZ
@given(data=st.data())
def test_fuzz_offsets(dataset, data):
    base = np.load(dataset / "train-000001.offsets.npy")
    choice = data.draw(st.sampled_from(["perturb", "random", "bytes"]))
    with tempfile.TemporaryDirectory() as tmp:
        out = copy_dataset(dataset, Path(tmp) / "ds")
        idx = out / "train-000001.offsets.npy"
        if choice == "perturb":
            arr = base.copy()
            for _ in range(data.draw(st.integers(1, 3))):
                arr[data.draw(st.integers(0, len(arr) - 1))] += data.draw(st.integers(-5000, 5000))
            np.save(idx, arr)
        elif choice == "random":
            values = data.draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=0, max_size=14))
            np.save(idx, np.array(values, dtype=np.int64))
        else:
            raw = bytearray(idx.read_bytes())
            for _ in range(data.draw(st.integers(1, 4))):
                raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
            idx.write_bytes(bytes(raw))
        rewrite_manifest(out, lambda m: m["splits"]["train"]["shards"][1]["index"].update(bytes=idx.stat().st_size))
        check_everything_or_dataset_error(out)


@FUZZ
@given(data=st.data())
def test_fuzz_tar_bytes(dataset, data):
    with tempfile.TemporaryDirectory() as tmp:
        out = copy_dataset(dataset, Path(tmp) / "ds")
        tar = out / "train-000000.tar"
        raw = bytearray(tar.read_bytes())
        offsets = np.load(out / "train-000000.offsets.npy")
        members = parse_members(bytes(raw), 0, int(offsets[-1]))  # mutate headers and small fields often
        for _ in range(data.draw(st.integers(1, 8))):
            _name, start, size = data.draw(st.sampled_from(members))
            pos = data.draw(st.integers(start - BLOCK, start + max(size, 1) - 1) | st.integers(0, len(raw) - 1))
            raw[pos] = data.draw(st.integers(0, 255))
        tar.write_bytes(bytes(raw))
        check_everything_or_dataset_error(out, decode=data.draw(st.sampled_from([None, "numpy"])))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)


def paths_in(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths_in(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths_in(v, (*prefix, i))
    return out


@FUZZ
@given(data=st.data())
def test_fuzz_manifest(dataset, data):
    m = json.loads((dataset / "manifest.json").read_text())
    where = data.draw(st.sampled_from(paths_in(m)[1:]))
    value = data.draw(JSON | st.sampled_from(["../x", "/etc/passwd", "train-000002.tar", "val-000000.offsets.npy"])
                      | st.integers(0, 200000))

    def edit(doc: dict) -> None:
        node = doc
        for part in where[:-1]:
            node = node[part]
        node[where[-1]] = value

    with tempfile.TemporaryDirectory() as tmp:
        out = copy_dataset(dataset, Path(tmp) / "ds")
        rewrite_manifest(out, edit)
        check_everything_or_dataset_error(out, decode="pil")


# -- the member table: built in numpy, exactly what a sample-by-sample parse builds ---------------


def python_table(tar: Path, offsets: np.ndarray) -> tuple:
    """The loader's table as it was built before scan_samples: parse_sample, sample by sample."""
    return member_table(tar.read_bytes(), offsets, where=str(tar))


def loader_table(ds: TarDataset, s: int) -> tuple:
    t = ds._table(s)
    return t.keys, list(t.first), list(t.data), list(t.size), list(t.ext), t.exts


def test_tables_equal_the_sample_by_sample_parse(dataset):
    ds = TarDataset(dataset)
    for s, tar in enumerate(ds.shard_paths):
        want = python_table(tar, np.load(tar.with_name(tar.name.replace(".tar", ".offsets.npy"))))
        assert loader_table(ds, s) == want
        assert want[5] == ["jpg", "cls", "json", "txt", "npy", "pyd"] and len(want[2]) == 6 * len(want[0])


def tarfile_shard(tar: Path, samples: list[tuple[str, Fields]]) -> list[int]:
    """A shard as Python's tarfile writes it (its own modes, owners, mtimes): valid ustar, not shardsmith's bytes."""
    offsets = []
    with tarfile.open(tar, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, (key, fields) in enumerate(samples):
            offsets.append(tf.offset)
            for ext, data in fields:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode, info.uid, info.uname = len(data), 1700000000 + i, 0o600, 1000, "u"
                tf.addfile(info, io.BytesIO(data))
        offsets.append(tf.offset)
    return offsets


def test_shards_that_tarfile_wrote_are_read(dataset, tmp_path):
    out = copy_dataset(dataset, tmp_path / "ds")
    tar = out / "train-000001.tar"
    offsets = tarfile_shard(tar, TRAIN[10:20])
    idx = out / "train-000001.offsets.npy"
    np.save(idx, np.array(offsets, np.int64))

    def edit(m):
        shard = m["splits"]["train"]["shards"][1]
        shard.update(bytes=tar.stat().st_size)
        shard["index"].update(bytes=idx.stat().st_size)

    rewrite_manifest(out, edit)
    ds = TarDataset(out)
    for i in range(25):
        check_sample(ds[i], *TRAIN[i])
    assert loader_table(ds, 1) == python_table(tar, np.array(offsets))


def member_offsets(tar: Path, offsets: np.ndarray, j: int) -> list[int]:
    """Header offsets of sample j's members."""
    return [d - BLOCK for _, d, _ in parse_members(tar.read_bytes(), int(offsets[j]), int(offsets[j + 1]))]


def set_header(raw: bytearray, at: int, start: int, value: bytes) -> None:
    raw[at + start:at + start + len(value)] = value
    raw[at + 148:at + 156] = b" " * 8
    raw[at + 148:at + 156] = b"%06o\x00 " % sum(raw[at:at + BLOCK])


CORRUPTIONS = {
    "bad checksum": lambda raw, offs, hs: raw.__setitem__(hs[2] + 153, ord("0") + (raw[hs[2] + 153] - 47) % 8),
    "bad size digit": lambda raw, offs, hs: set_header(raw, hs[1], 134, b"9"),
    "name with a slash": lambda raw, offs, hs: set_header(raw, hs[3], 0, b"t00014.a/b\x00"),
    "member runs past the sample end": lambda raw, offs, hs: set_header(
        raw, hs[5], 124, b"%011o" % (int(offs[5]) - hs[5])),
    "repeated extension": lambda raw, offs, hs: set_header(raw, hs[4], 0, b"t00014.cls\x00"),
    "index cuts a sample": lambda raw, offs, hs: offs.__setitem__(5, hs[3]),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupt_shards_raise_naming_shard_and_byte(dataset, tmp_path, name):
    out = copy_dataset(dataset, tmp_path / "ds")
    tar, idx = out / "train-000001.tar", out / "train-000001.offsets.npy"
    offsets = np.load(idx)
    raw = bytearray(tar.read_bytes())
    CORRUPTIONS[name](raw, offsets, member_offsets(tar, offsets, 4))  # sample 4 of the shard (t00014)
    tar.write_bytes(bytes(raw))
    np.save(idx, offsets)
    with pytest.raises(DatasetError) as want:
        python_table(tar, offsets)
    assert str(want.value).startswith(f"{tar}: ") and "byte" in str(want.value)
    ds = TarDataset(out)
    for i in (10, 14, 19):
        with pytest.raises(DatasetError) as got:
            ds[i]
        assert str(got.value) == str(want.value)
    check_sample(ds[0], *TRAIN[0])
    check_sample(ds[24], *TRAIN[24])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_maps_shards_of_its_own(dataset):
    ds = TarDataset(dataset)
    check_sample(ds[3], *TRAIN[3])
    parent_map = ds._maps[0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it read through a map of its own, then leave at once
        ok = False
        try:
            sample = ds[4]
            ok = sample["__key__"] == TRAIN[4][0] and sample["jpg"] == dict(TRAIN[4][1])["jpg"] \
                and ds._maps[0] is not parent_map and ds._pid == os.getpid()
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(pid, 0)
    assert ds._maps[0] is parent_map
    check_sample(ds[4], *TRAIN[4])
