"""The loss bits of a chat dataset on disk (issue 30): (id, mask) units through both token writers,
each shard's ``.mask.bin`` beside it (packbits, padding off), read back for any span, and the
labels of a varlen batch (-100 where the loss does not count and at every packed boundary)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.formats.tokens.masks import MaskFile, ShardMasks, mask_bytes, unit_dtype, verify_masks
from shardsmith.formats.tokens.packed import IGNORE_INDEX, varlen_batch
from shardsmith.formats.tokens.packed_writer import PackedTokensWriter
from shardsmith.formats.tokens.writer import TokensWriter
from shardsmith.kit.dataset_files import files_for

UNIT = unit_dtype(np.dtype(np.uint16))


def units_of(docs: list[tuple[list[int], list[bool]]]) -> tuple[np.ndarray, np.ndarray]:
    """Documents of (ids, bits) as the payload a chat run's gather hands a writer, and its byte lengths."""
    flat = np.zeros(sum(len(ids) for ids, _ in docs), UNIT)
    at = 0
    for ids, bits in docs:
        flat["id"][at:at + len(ids)] = ids
        flat["mask"][at:at + len(ids)] = bits
        at += len(ids)
    return flat, np.array([len(ids) * UNIT.itemsize for ids, _ in docs], dtype=np.int64)


doc = st.integers(1, 40).flatmap(lambda n: st.tuples(st.lists(st.integers(0, 999), min_size=n, max_size=n),
                                                     st.lists(st.booleans(), min_size=n, max_size=n)))


@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.lists(st.booleans(), max_size=30), max_size=8))
def test_a_mask_file_holds_its_bits_whatever_the_writes(tmp_path_factory, chunks):
    path = tmp_path_factory.mktemp("m") / "s.mask.bin"
    f = MaskFile(path)
    for bits in chunks:
        f.write(np.array(bits, dtype=bool))
    entry = f.commit()
    want = np.array([b for bits in chunks for b in bits], dtype=bool)
    data = np.frombuffer(path.read_bytes(), np.uint8)
    assert len(data) == mask_bytes(len(want)) == entry["bytes"]
    assert np.array_equal(np.unpackbits(data, count=len(want)).astype(bool), want)
    assert not np.unpackbits(data)[len(want):].any()
    assert entry["tokens"] == len(want) and entry["trained"] == int(want.sum())


def _manifest_of(out, writer, split="train") -> dict:
    shards = [{"path": s.path, "samples": s.samples, "bytes": s.bytes, "sha256": s.sha256, **s.extra}
              for s in writer.shards]
    return {"splits": {split: {"shards": shards}}}


@settings(max_examples=25, deadline=None)
@given(docs=st.lists(doc, min_size=1, max_size=12), shard_tokens=st.integers(5, 60))
def test_documents_keep_their_bits_across_rolling_shards(tmp_path_factory, docs, shard_tokens):
    out = tmp_path_factory.mktemp("w")
    w = TokensWriter(out_dir=out, split="train", dtype=UNIT, shard_tokens=shard_tokens)
    payload, lengths = units_of(docs)
    w.write_batch(lengths, memoryview(payload.tobytes()))
    w.close()
    shards = _manifest_of(out, w)["splits"]["train"]["shards"]
    ids = np.concatenate([np.fromfile(out / s["path"], np.uint16) for s in shards])
    assert np.array_equal(ids, payload["id"])  # the ids alone in the .bin, as Megatron reads them
    starts = np.concatenate([[0], np.cumsum([len(np.fromfile(out / s["path"], np.uint16)) for s in shards])])
    masks = ShardMasks(files_for(out), shards, starts, where=out)
    assert np.array_equal(masks.span(0, len(ids)), payload["mask"].astype(bool))
    for a in range(0, len(ids), 7):  # any span, across shard edges
        b = min(len(ids), a + 11)
        assert np.array_equal(masks.span(a, b - a), payload["mask"][a:b].astype(bool))
    assert verify_masks(files_for(out), shards, np.dtype(np.uint16)) == []


@settings(max_examples=25, deadline=None)
@given(docs=st.lists(doc, min_size=1, max_size=12), seq_len=st.integers(8, 48))
def test_packed_sequences_carry_the_bits_of_their_documents_and_padding_is_off(tmp_path_factory, docs, seq_len):
    out = tmp_path_factory.mktemp("p")
    w = PackedTokensWriter(out_dir=out, split="train", dtype=UNIT, shard_tokens=3 * seq_len, seq_len=seq_len,
                           pad_id=1000, window_tokens=8 * seq_len)
    payload, lengths = units_of(docs)
    w.write_batch(lengths, memoryview(payload.tobytes()))
    w.close()
    shards = _manifest_of(out, w)["splits"]["train"]["shards"]
    ids = np.concatenate([np.fromfile(out / s["path"], np.uint16) for s in shards])
    starts = np.concatenate([[0], np.cumsum([s["tokens"] for s in shards])])
    bits = ShardMasks(files_for(out), shards, starts, where=out).span(0, len(ids))
    assert not bits[ids == 1000].any()  # padding never trained on
    # every (id, bit) pair of the input is in the output as often (packing moves tokens with their bits)
    got = sorted(zip(ids[ids != 1000].tolist(), bits[ids != 1000].tolist()))
    assert got == sorted(zip(payload["id"].tolist(), payload["mask"].astype(bool).tolist()))
    assert sum(s["mask"]["trained"] for s in shards) == int(payload["mask"].sum())
    assert verify_masks(files_for(out), shards, np.dtype(np.uint16)) == []


def test_verify_names_a_mask_that_lies(tmp_path):
    w = TokensWriter(out_dir=tmp_path, split="train", dtype=UNIT, shard_tokens=100)
    payload, lengths = units_of([([1, 2, 3, 4, 5], [0, 1, 1, 0, 1])])
    w.write_batch(lengths, memoryview(payload.tobytes()))
    w.close()
    shards = _manifest_of(tmp_path, w)["splits"]["train"]["shards"]
    shards[0]["mask"]["trained"] = 2
    assert any("tokens trained on" in p for p in verify_masks(files_for(tmp_path), shards, np.dtype(np.uint16)))
    del shards[0]["mask"]
    assert any("names no loss mask" in p for p in verify_masks(files_for(tmp_path), shards, np.dtype(np.uint16)))


def test_labels_skip_untrained_tokens_padding_and_every_packed_boundary():
    items = [{"tokens": np.array([5, 6, 7, 8, 9, 0], np.int64), "cu_seqlens": np.array([0, 3, 5], np.int32),
              "loss_mask": np.array([0, 1, 1, 1, 1, 0], bool)},
             {"tokens": np.array([1, 2, 3, 4, 5, 6], np.int64), "cu_seqlens": np.array([0, 6], np.int32)}]
    b = varlen_batch(items, seq_len=6)
    I = IGNORE_INDEX  # noqa: E741
    # row 0: doc [5 6 7] (5 untrained and first), doc [8 9] (8 first: never predicted across the boundary), pad
    assert b["labels"].tolist() == [[I, 6, 7, I, 9, I], [I, 2, 3, 4, 5, 6]]
    # an item without a mask (pre-training data in a mixture) trains on its real tokens
    assert b["loss_mask"].tolist() == [[False, True, True, True, True, False], [True] * 6]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
