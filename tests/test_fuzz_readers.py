"""Fuzzing the readers of what shardsmith wrote: a malformed ``.idx`` or HDF5 event shard raises
shardsmith's DatasetError (never IndexError, KeyError, OSError, a hang or a crash), and the event
payload codec round-trips every schema (hypothesis; the tar and manifest readers are fuzzed in
test_tar_loader.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_docs, run_cli, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardsmith.core.events import EventChunk, EventSchema, Field, check_chunk, decode, encode
from shardsmith.demo.icecube_like import make_icecube_kaggle_like
from shardsmith.errors import DatasetError

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def copy_dataset(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rehash(out: Path) -> None:
    """Make the manifest agree with the files as they are now (sizes and sha256), so the damage
    reaches the reader under test instead of the manifest's size check."""
    m = json.loads((out / "manifest.json").read_text())
    for split in m["splits"].values():
        for shard in split["shards"]:
            for entry in (shard, shard.get("index")):
                if entry and (out / entry["path"]).is_file():
                    data = (out / entry["path"]).read_bytes()
                    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (out / "manifest.json").write_text(json.dumps(m))


def only_dataset_errors(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None if it raised DatasetError; anything else fails the test."""
    try:
        return fn()
    except DatasetError as exc:
        assert "\n" not in str(exc), str(exc)
        return None


# -- Megatron .idx ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path) -> Path:
    root = tmp_path_factory.mktemp("packed")
    write_jsonl(root / "in" / "a.jsonl", make_docs(60))
    res = run_cli("pack-tokens", root / "in", "-o", root / "out", "--tokenizer", bpe_tokenizer, "-q",
                  "--shard-tokens", "400", "--seq-len", "16")
    assert res.exit_code == 0, res.stderr
    assert len(list((root / "out").glob("train-*.idx"))) >= 3
    return root / "out"


_HEAD = struct.Struct("<9sQBQQ")


def idx_mutation(data: st.DataObject, raw: bytes) -> bytes:
    """A damaged .idx: bytes flipped, cut or added, or a header whose fields lie."""
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "header", "arrays"]))
    buf = bytearray(raw)
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 6))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        del buf[data.draw(st.integers(0, len(buf) - 1)):]
    elif kind == "extend":
        buf += data.draw(st.binary(min_size=1, max_size=64))
    elif kind == "header":
        magic, version, code, seqs, docs = _HEAD.unpack_from(buf)
        field = data.draw(st.sampled_from(["version", "code", "seqs", "docs", "both"]))
        big = st.integers(0, 2**64 - 1) | st.integers(0, 40)
        if field == "version":
            version = data.draw(big)
        elif field == "code":
            code = data.draw(st.integers(0, 255))
        elif field in ("seqs", "both"):
            seqs = data.draw(big)
        if field in ("docs", "both"):
            docs = data.draw(big)
        _HEAD.pack_into(buf, 0, magic, version, code, seqs, docs)
    else:  # plausible sizes, lying arrays: lengths, pointers or document indices
        _, _, _, seqs, docs = _HEAD.unpack_from(buf)
        where = data.draw(st.sampled_from(["lengths", "pointers", "documents"]))
        start, item, count = {"lengths": (_HEAD.size, 4, seqs), "pointers": (_HEAD.size + 4 * seqs, 8, seqs),
                              "documents": (_HEAD.size + 12 * seqs, 8, docs)}[where]
        if count:
            i = data.draw(st.integers(0, count - 1))
            fmt = "<i" if item == 4 else "<q"
            (old,) = struct.unpack_from(fmt, buf, start + item * i)
            lo, hi = (-(2**31), 2**31 - 1) if item == 4 else (-(2**63), 2**63 - 1)
            new = data.draw(st.integers(lo, hi) | st.integers(max(lo, old - 3), min(hi, old + 3)))
            struct.pack_into(fmt, buf, start + item * i, new)
    return bytes(buf)


@FUZZ
@given(data=st.data())
def test_fuzz_idx_files(packed, data):
    from shardsmith.formats.tokens.dataset import TokenDataset, TokenDocuments
    from shardsmith.formats.tokens.indexed import read_idx

    name = data.draw(st.sampled_from(sorted(p.name for p in packed.glob("train-*.idx"))))
    raw = (packed / name).read_bytes()
    bad = idx_mutation(data, raw)
    with tempfile.TemporaryDirectory() as tmp:
        out = copy_dataset(packed, Path(tmp) / "ds")
        (out / name).write_bytes(bad)
        if data.draw(st.booleans()):
            rehash(out)
        bin_bytes = (out / name.replace(".idx", ".bin")).stat().st_size
        shard = only_dataset_errors(lambda: read_idx(out / name, bin_bytes=bin_bytes))
        if shard is not None:  # accepted: then it is self-consistent and covers the .bin exactly
            assert shard.lengths.min(initial=0) >= 0 and int(shard.lengths.sum()) * shard.dtype.itemsize == bin_bytes
        docs = only_dataset_errors(lambda: TokenDocuments(out))
        if docs is not None:
            total = sum(len(docs[i]) for i in range(len(docs)))
            assert total == TokenDataset(out).tokens
        windows = TokenDataset(out)  # opens no .idx: windows need only the .bin files
        only_dataset_errors(lambda: [windows.cu_seqlens(i) for i in (0, len(windows) - 1)])
        if shard is None:
            assert docs is None, "a rejected .idx must not be accepted through the loader"


def test_idx_header_claims_that_do_not_fit_are_rejected_quickly(packed, tmp_path):
    """Huge counts in the header: refused by size, never allocated or looped over."""
    from shardsmith.formats.tokens.indexed import read_idx

    raw = bytearray((packed / "train-000000.idx").read_bytes())
    magic, version, code, _, _ = _HEAD.unpack_from(raw)
    for seqs, docs in [(2**64 - 1, 2**64 - 1), (2**61, 1), (0, 0), (0, 1), (3, 2**63)]:
        _HEAD.pack_into(raw, 0, magic, version, code, seqs, docs)
        (tmp_path / "x.idx").write_bytes(bytes(raw))
        with pytest.raises(DatasetError, match="x.idx"):
            read_idx(tmp_path / "x.idx", bin_bytes=(packed / "train-000000.bin").stat().st_size)


# -- HDF5 event shards ----------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=["none", "gzip"])
def events_h5(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"h5-{request.param}")
    batches, meta = make_icecube_kaggle_like(root / "ic", batches=1, events_per_batch=60, mean_pulses=6, seed=3)
    res = run_cli("convert", *batches, "-o", root / "out", "--to", "hdf5", "--group-by", "event_id",
                  "--events-table", meta, "--shard-samples", "25", "--compression", request.param, "-q")
    assert res.exit_code == 0, res.stderr
    return root / "out"


def read_everything(out: Path, seed: int) -> None:
    """Every way the loader reads: each call returns data or raises DatasetError, nothing else."""
    from shardsmith.formats.hdf5.dataset import EventDataset

    ds = only_dataset_errors(lambda: EventDataset(out))
    if ds is None:
        return
    n = len(ds)
    rng = np.random.default_rng(seed)
    for i in (0, n - 1, int(rng.integers(0, n))):
        event = only_dataset_errors(lambda i=i: ds[i])
        if event is not None:
            assert set(event) == {f.name for f in ds.schema.fields}
    for idx in (np.arange(n), rng.permutation(n)[:20], np.array([n - 1, 0, n - 1])):
        batch = only_dataset_errors(lambda idx=idx: ds.get_batch(idx))
        if batch is not None:
            assert len(batch) == len(idx)
            for c in ds.schema.counters:
                off = batch.offsets(c)
                assert off[0] == 0 and np.all(np.diff(off) >= 0)
                for f in ds.schema.members(c):
                    assert len(batch.ragged[f.name].values) == off[-1]
    for c in ds.schema.counters:
        lengths = only_dataset_errors(lambda c=c: ds.lengths(c))
        if lengths is not None:
            assert len(lengths) == n and lengths.min(initial=0) >= 0
    only_dataset_errors(lambda: sum(len(b) for b in ds.iter(batch_size=16, seed=seed)))
    ds.close()


ATTR_VALUES = (st.integers(-2**63, 2**63 - 1) | st.text(max_size=20) | st.binary(max_size=20)
               | st.floats(allow_nan=True) | st.lists(st.integers(-5, 100), min_size=0, max_size=4)
               | st.lists(st.text(max_size=5), min_size=1, max_size=3)
               | st.sampled_from(["{}", "[]", '{"x": 1}', "shardsmith-events", "null", 1, 25, 0]))


def mutate_h5(path: Path, kind: str, data: st.DataObject) -> None:
    """One damage to a shard, made with h5py: offsets, values, fixed fields, attributes or links."""
    import h5py

    with h5py.File(path, "r+") as f:
        if kind == "offsets":
            off = f["_counters/n_rows"]
            arr = off[...]
            for _ in range(data.draw(st.integers(1, 3))):
                i = data.draw(st.integers(0, len(arr) - 1))
                near = st.integers(max(-2**63, int(arr[i]) - 5), min(2**63 - 1, int(arr[i]) + 5))
                arr[i] = data.draw(st.integers(-2**63, 2**63 - 1) | near)
            off[...] = arr
        elif kind in ("values", "fixed"):
            name = data.draw(st.sampled_from(["time/values", "charge/values", "auxiliary/values"] if kind == "values"
                                             else ["event_id", "azimuth", "first_pulse_index"]))
            old = f[name]
            length = max(0, old.shape[0] + data.draw(st.integers(-3, 3)))
            dtype = data.draw(st.sampled_from([old.dtype, np.dtype("<f4"), np.dtype("<i2"), np.dtype(">f8")]))
            shape = (length, *data.draw(st.sampled_from([old.shape[1:], (2,)])))
            del f[name]
            f.create_dataset(name, data=np.zeros(shape, dtype=dtype))
        elif kind == "attrs":
            name = data.draw(st.sampled_from(["format", "format_version", "schema", "samples", "counters"]))
            if data.draw(st.booleans()):
                del f.attrs[name]
            else:
                value = data.draw(ATTR_VALUES)
                if isinstance(value, list):
                    value = np.array(value, dtype=object if value and isinstance(value[0], str) else np.int64)
                try:
                    f.attrs[name] = value
                except (TypeError, ValueError):  # h5py cannot store it: store a string instead
                    f.attrs[name] = repr(value)
        else:
            name = data.draw(st.sampled_from(["time/offsets", "charge/values", "event_id", "_counters/n_rows"]))
            how = data.draw(st.sampled_from(["soft", "external", "group", "copy"]))
            copy = f[name][...]
            del f[name]
            if how == "soft":
                f[name] = h5py.SoftLink("/azimuth")
            elif how == "external":
                f[name] = h5py.ExternalLink("/etc/hostname", "/x")
            elif how == "group":
                f.create_group(name)
            else:  # its own dataset: no longer the shared (hard-linked) offsets
                copy = copy.copy()
                if copy.ndim and len(copy) > 1:
                    copy[-1] += 1
                f.create_dataset(name, data=copy)


@pytest.mark.parametrize("kind", ["offsets", "values", "fixed", "attrs", "links"])
@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_fuzz_h5_shards_through_h5py(events_h5, kind, data):
    name = data.draw(st.sampled_from(sorted(p.name for p in events_h5.glob("train-*.h5"))))
    with tempfile.TemporaryDirectory() as tmp:
        out = copy_dataset(events_h5, Path(tmp) / "ds")
        mutate_h5(out / name, kind, data)
        rehash(out)
        read_everything(out, seed=data.draw(st.integers(0, 100)))


@FUZZ
@given(data=st.data())
def test_fuzz_h5_truncated_or_flipped_data(events_h5, data):
    """Cut shards (with the manifest rehashed, or not), and bytes flipped inside datasets' data:
    the offsets' own checks and HDF5's filters catch what the manifest size check does not."""
    import h5py

    name = data.draw(st.sampled_from(sorted(p.name for p in events_h5.glob("train-*.h5"))))
    with tempfile.TemporaryDirectory() as tmp:
        out = copy_dataset(events_h5, Path(tmp) / "ds")
        path = out / name
        raw = bytearray(path.read_bytes())
        if data.draw(st.booleans()):
            del raw[data.draw(st.integers(0, len(raw) - 1)):]
            path.write_bytes(bytes(raw))
            if data.draw(st.booleans()):
                rehash(out)
        else:
            with h5py.File(path, "r") as f:  # where each dataset's bytes are (contiguous or chunks)
                spans = []
                for ds_name in ("_counters/n_rows", "time/values", "event_id", "sensor_id/values"):
                    ds = f[ds_name]
                    if ds.chunks is None:
                        if ds.id.get_offset() is not None:
                            spans.append((ds.id.get_offset(), ds.id.get_storage_size()))
                    else:
                        for k in range(ds.id.get_num_chunks()):
                            info = ds.id.get_chunk_info(k)
                            spans.append((info.byte_offset, info.size))
            start, size = data.draw(st.sampled_from(spans))
            for _ in range(data.draw(st.integers(1, 4))):
                raw[start + data.draw(st.integers(0, size - 1))] ^= data.draw(st.integers(1, 255))
            path.write_bytes(bytes(raw))
            rehash(out)
        read_everything(out, seed=data.draw(st.integers(0, 100)))


SPEC_VALUES = (st.sampled_from(["<f4", "<i8", ">i2", "|b1", "O", "xx", "<U3", "<c16", "n_rows", "n_other", "event_id"])
               | st.none() | st.booleans() | st.integers(-3, 2**63) | st.lists(st.integers(-2, 10**20), max_size=3)
               | st.text(max_size=4))


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_fuzz_a_schema_that_lies_in_manifest_and_shards_alike(events_h5, data):
    """The manifest's schema and every shard's schema attribute changed the same way: the shards'
    datasets, not the schema, decide what is read."""
    import h5py

    m = json.loads((events_h5 / "manifest.json").read_text())
    schema = m["schema"]
    field = data.draw(st.sampled_from(sorted(schema)))
    key = data.draw(st.sampled_from(["dtype", "shape", "ragged", "counter", "extra"]))
    value = data.draw(SPEC_VALUES)
    if data.draw(st.booleans()):
        schema[field][key] = value
    elif key != "extra":
        schema[field].pop(key, None)
    text = json.dumps(schema)
    with tempfile.TemporaryDirectory() as tmp:
        out = copy_dataset(events_h5, Path(tmp) / "ds")
        for path in out.glob("train-*.h5"):
            with h5py.File(path, "r+") as f:
                f.attrs["schema"] = text
        (out / "manifest.json").write_text(json.dumps(m))
        rehash(out)
        read_everything(out, seed=data.draw(st.integers(0, 100)))


def test_damaged_offsets_are_named(events_h5, tmp_path):
    """Not only no crash: the deep checks name the shard and what is wrong."""
    import h5py

    from shardsmith.formats.hdf5.dataset import EventDataset

    out = copy_dataset(events_h5, tmp_path / "ds")
    with h5py.File(out / "train-000001.h5", "r+") as f:
        off = f["_counters/n_rows"]
        off[-1] = off[-1] + 7
    rehash(out)
    ds = EventDataset(out)
    ds[0]  # another shard: fine
    with pytest.raises(DatasetError, match=r"train-000001\.h5: offsets of counter 'n_rows'"):
        ds[30]


@pytest.mark.parametrize("attr, value", [
    ("samples", np.array([25, 25])),  # compared as an array: "truth value … is ambiguous"
    ("format", np.array([1, 2])),
    ("format_version", np.array([1, 1])),
    ("samples", b"2\n5"),  # printed into the message: two lines
])
def test_found_by_fuzzing_attributes_of_another_kind(events_h5, tmp_path, attr, value):
    import h5py

    from shardsmith.formats.hdf5.dataset import EventDataset

    out = copy_dataset(events_h5, tmp_path / "ds")
    with h5py.File(out / "train-000000.h5", "r+") as f:
        f.attrs[attr] = value
    rehash(out)
    with pytest.raises(DatasetError, match=r"train-000000\.h5: ") as err:
        EventDataset(out)[0]
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("field, key, value, message", [
    ("sensor_id", "counter", [], "'schema.sensor_id.counter' must be str"),  # a list: unhashable where counters are grouped
    ("azimuth", "counter", "n_rows", "'schema.azimuth.ragged' is False, but its counter is 'n_rows'"),  # a fixed
    # dataset claimed ragged: refused by the manifest's own check, before the shard is read as a ragged group
    ("event_id", "shape", ["a"], "'schema.event_id.shape' must be a list of sizes"),
])
def test_found_by_fuzzing_schemas_that_lie(events_h5, tmp_path, field, key, value, message):
    import h5py

    from shardsmith.formats.hdf5.dataset import EventDataset

    out = copy_dataset(events_h5, tmp_path / "ds")
    m = json.loads((out / "manifest.json").read_text())
    m["schema"][field][key] = value
    for path in out.glob("train-*.h5"):
        with h5py.File(path, "r+") as f:
            f.attrs["schema"] = json.dumps(m["schema"])
    (out / "manifest.json").write_text(json.dumps(m))
    rehash(out)
    with pytest.raises(DatasetError, match=message):
        EventDataset(out)[0]


# -- the event payload codec --------------------------------------------------------------------------

DTYPES = ["|b1", "|i1", "|u1", "<i2", ">u2", "<f2", "<i4", "<u4", ">f4", "<f4", "<i8", ">i8", "<u8", "<f8", "<c8"]


@st.composite
def schemas(draw: st.DrawFn) -> EventSchema:
    n = draw(st.integers(1, 7))
    counters = draw(st.lists(st.sampled_from(["n_a", "n_b", "n_c"]), min_size=n, max_size=n))
    fields = []
    for i in range(n):
        ragged = draw(st.booleans())
        shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        fields.append(Field(name=f"f{i}", dtype=draw(st.sampled_from(DTYPES)), shape=shape,
                            counter=counters[i] if ragged else None))
    return EventSchema(tuple(fields))


@st.composite
def chunks(draw: st.DrawFn, schema: EventSchema) -> EventChunk:
    n = draw(st.integers(0, 12))  # an empty chunk too
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    offsets = {c: np.concatenate([[0], np.cumsum(rng.integers(0, 5, n))]).astype(np.int64)
               for c in schema.counters}
    columns = {}
    for f in schema.fields:
        rows = int(offsets[f.counter][-1]) if f.ragged else n
        raw = rng.integers(0, 256, rows * f.item_bytes, dtype=np.uint8)  # any bits: NaNs, odd bools, -0.0
        columns[f.name] = raw.view(f.np_dtype).reshape(rows, *f.shape)
    return EventChunk(first=draw(st.integers(0, 10**6)), n=n, columns=columns, offsets=offsets)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == \
        np.ascontiguousarray(b).tobytes()


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_encode_then_decode_is_the_identity(data):
    schema = data.draw(schemas())
    chunk = data.draw(chunks(schema))
    check_chunk(chunk, schema)
    lengths, payload = encode(chunk, schema)
    assert len(lengths) == chunk.n and np.all(lengths % 8 == 0) and int(lengths.sum()) == len(payload)
    again, payload_again = encode(chunk, schema)
    assert np.array_equal(again, lengths) and payload_again.tobytes() == payload.tobytes()  # padding is zeros
    back = decode(lengths, payload, schema, first=chunk.first)
    check_chunk(back, schema)
    assert back.n == chunk.n and back.first == chunk.first
    for c in schema.counters:
        assert np.array_equal(back.offsets[c], chunk.offsets[c])
    for f in schema.fields:
        assert same_bits(back.columns[f.name], chunk.columns[f.name]), f
    # records in any order (as the shuffle moves them) decode to the same events in that order
    perm = np.asarray(data.draw(st.permutations(range(chunk.n))), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    moved = b"".join(payload[starts[i]:starts[i + 1]].tobytes() for i in perm)
    shuffled = decode(lengths[perm], np.frombuffer(moved, dtype=np.uint8), schema)
    want = chunk.take(perm, schema)
    for f in schema.fields:
        assert same_bits(shuffled.columns[f.name], want.columns[f.name]), f
    for c in schema.counters:
        assert np.array_equal(shuffled.offsets[c], want.offsets[c])
    # encoded straight in that order (the scatter), and decoded in place from the unmoved payload (the gather)
    in_order = encode(chunk, schema, order=perm)[1]
    assert in_order.tobytes() == moved
    in_place = decode(lengths[perm], payload, schema, starts=starts[:-1][perm])
    for f in schema.fields:
        assert same_bits(in_place.columns[f.name], want.columns[f.name]), f


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_decode_of_an_unaligned_or_short_payload(data):
    """A payload at an odd address decodes the same; one of the wrong size is refused."""
    schema = data.draw(schemas())
    chunk = data.draw(chunks(schema))
    lengths, payload = encode(chunk, schema)
    shifted = np.frombuffer(b"\0" + payload.tobytes(), dtype=np.uint8)[1:]
    back = decode(lengths, shifted, schema)
    for f in schema.fields:
        assert same_bits(back.columns[f.name], chunk.columns[f.name])
    if len(payload):
        cut = data.draw(st.integers(1, len(payload)))
        with pytest.raises(ValueError, match="payload holds"):
            decode(lengths, payload[:-cut], schema)


def test_a_count_past_the_payload_is_refused_not_read_short():
    """A record whose count claims more values than the payload holds fails, on the path that
    copies one slice per event as on the one that indexes every value."""
    schema = EventSchema((Field(name="id", dtype="<i8"), Field(name="hits", dtype="<f4", counter="n")))
    for hits in (2, 400):  # short events: one index per value; long ones: one slice per event
        offsets = np.arange(0, 3 * hits + 1, hits, dtype=np.int64)
        chunk = EventChunk(first=0, n=3, columns={"id": np.arange(3), "hits": np.ones(3 * hits, np.float32)},
                           offsets={"n": offsets})
        lengths, payload = encode(chunk, schema)
        broken = payload.copy()
        last = int(lengths[:-1].sum())
        broken[last + 8:last + 16] = np.frombuffer(np.int64(hits + 50).tobytes(), np.uint8)  # the last count
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        with pytest.raises((ValueError, IndexError)):
            decode(lengths, broken, schema, starts=starts)
