"""The keyed external shuffle: a permutation, the same for any partitioning, uniform over permutations."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.core.ragged import starts_of, take_ragged
from shardsmith.engine.shuffle.buckets import bucket_count, bucket_of, sort_group
from shardsmith.engine.shuffle.mapped import PartMaps, map_group
from shardsmith.engine.shuffle.open_parts import OpenParts
from shardsmith.engine.shuffle.partfile import PartWriter
from shardsmith.engine.shuffle.run import Sizing, task_size
from shardsmith.engine.shuffle.segments import Segments, split_segments
from shardsmith.engine.shuffle.split_gather import SplitGather
from shardsmith.errors import DatasetError
from shardsmith.kit.keys import input_order, mix64, shuffle_keys, split_draws
from shardsmith.kit.splits import assign_splits, parse_splits


def groups(tmp: Path, files: list[int], seed: int, n_buckets: int, cut: int, flush: int = 1 << 30, *,
           budget: int) -> list[Segments]:
    """Samples (file f has files[f] records, payload = its identity) scattered into part files:
    the one split's bucket groups under ``budget``."""
    parts = []
    task = 0
    for f, n in enumerate(files):
        recs = np.arange(n)
        for lo in range(0, max(n, 1), max(cut, 1)):  # a file split into tasks of `cut` records
            sel = recs[lo:lo + cut]
            if not len(sel):
                continue
            keys = shuffle_keys(seed, f"f{f}", sel)
            payloads = [f"f{f}:{r};".encode() for r in sel]
            path = tmp / f"part-{task}.bin"
            w = PartWriter(path, flush_bytes=flush)
            buckets = bucket_of(keys, n_buckets)
            for b in np.unique(buckets):
                m = buckets == b
                chosen = [p for p, ok in zip(payloads, m) if ok]
                w.add(split=0, bucket=int(b), keys=keys[m], order=input_order(f, sel[m]),
                      lengths=np.array([len(p) for p in chosen]), payload=b"".join(chosen))
            w.write({"task": task})
            parts.append(str(path))
            task += 1
    split = SplitGather.of("train", split_segments(parts, 1)[0], budget=budget)
    return [split.group(g) for g in range(split.groups)]


def shuffle_via_parts(tmp: Path, files: list[int], seed: int, n_buckets: int, budget: int, cut: int,
                      flush: int = 1 << 30, mapped: bool = False) -> list[bytes]:
    """Run the samples through parts and gather (reading each group into memory, or ``mapped``:
    from the part files' pages, as ``map_group``)."""
    table = groups(tmp, files, seed, n_buckets, cut, flush, budget=budget)
    out: list[bytes] = []
    if mapped:
        maps = PartMaps(resident=1 << 12)  # pages let go all the time: what is read must not depend on it
        for group in table:
            got = map_group(group, maps=maps)
            out += [bytes(got.sources[s][p:p + n]) for s, p, n in zip(got.src, got.starts, got.lengths)]
        return out
    parts = OpenParts(limit=2)  # past it, a part is opened for its read: the same bytes either way
    for group in table:
        batch = sort_group(group, parts=parts)
        data = bytes(batch.payload)
        pos = 0
        for n in batch.lengths:
            out.append(data[pos:pos + int(n)])
            pos += int(n)
    return out


@settings(max_examples=40, deadline=None)
@given(files=st.lists(st.integers(0, 40), min_size=1, max_size=4), seed=st.integers(0, 2**32),
       n_buckets=st.sampled_from([1, 2, 8, 64]), budget=st.integers(1, 4000), cut=st.integers(1, 50),
       flush=st.integers(1, 600))
def test_shuffle_is_a_permutation_independent_of_buckets_budget_and_tasks(tmp_path_factory, files, seed, n_buckets,
                                                                          budget, cut, flush):
    tmp = tmp_path_factory.mktemp("parts")
    got = shuffle_via_parts(tmp, files, seed, n_buckets, budget, cut, flush)
    every = [f"f{f}:{r};".encode() for f, n in enumerate(files) for r in range(n)]
    assert sorted(got) == sorted(every)  # a permutation: nothing lost, nothing doubled
    ref = shuffle_via_parts(tmp_path_factory.mktemp("ref"), files, seed, 1, 10**9, 10**9)
    assert got == ref  # same order for any partitioning


@settings(max_examples=30, deadline=None)
@given(files=st.lists(st.integers(0, 40), min_size=1, max_size=4), seed=st.integers(0, 2**32),
       n_buckets=st.sampled_from([1, 2, 8, 64]), budget=st.integers(1, 4000), cut=st.integers(1, 50),
       flush=st.sampled_from([1, 64, 1 << 30]))
def test_a_mapped_gather_reads_what_a_read_gather_reads(tmp_path_factory, files, seed, n_buckets, budget, cut, flush):
    """``map_group`` (one source per part file, samples located through every segment of a group,
    parts flushed in several runs of segments) hands on the same samples in the same order."""
    read = shuffle_via_parts(tmp_path_factory.mktemp("read"), files, seed, n_buckets, budget, cut, flush)
    mapped = shuffle_via_parts(tmp_path_factory.mktemp("mapped"), files, seed, n_buckets, budget, cut, flush,
                               mapped=True)
    assert mapped == read


@settings(max_examples=30, deadline=None)
@given(files=st.lists(st.integers(1, 40), min_size=1, max_size=4), seed=st.integers(0, 2**32),
       n_buckets=st.sampled_from([1, 8]), budget=st.integers(50, 4000), flush=st.sampled_from([64, 1 << 30]),
       cuts=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=8))
def test_a_mapped_group_cut_to_a_gather_range_is_the_read_one(tmp_path_factory, files, seed, n_buckets, budget,
                                                              flush, cuts):
    """A gather range that starts or ends inside a group (``lo``, ``hi``): the same samples mapped
    as read."""
    table = groups(tmp_path_factory.mktemp("parts"), files, seed, n_buckets, cut=7, flush=flush, budget=budget)
    maps, parts = PartMaps(resident=1 << 12), OpenParts()
    for k, group in enumerate(table):
        n = group.samples
        a, b = sorted(int(x * n) for x in cuts[k % len(cuts)])
        read = sort_group(group, a, b, parts=parts)
        got = map_group(group, a, b, maps=maps)
        assert [bytes(got.sources[s][p:p + m]) for s, p, m in zip(got.src, got.starts, got.lengths)] == \
            [bytes(read.source[p:p + m]) for p, m in zip(read.starts, read.lengths)]


@pytest.mark.parametrize("size", [0, 3000], ids=["emptied", "inside a payload"])
def test_a_part_file_cut_short_is_refused_by_the_mapped_gather(tmp_path, size):
    path = tmp_path / "part-0.bin"
    w = PartWriter(path)
    keys = shuffle_keys(1, "f", np.arange(50))
    w.add(split=0, bucket=0, keys=keys, order=input_order(0, np.arange(50)), lengths=np.full(50, 100),
          payload=bytes(5000))
    w.write({"task": 0})
    split = SplitGather.of("train", split_segments([str(path)], 1)[0], budget=1 << 20)
    with open(path, "r+b") as fh:
        fh.truncate(size)
    with pytest.raises(DatasetError, match="shorter than its footer"):
        map_group(split.group(0), maps=PartMaps(resident=1 << 20))


def test_order_is_sorted_by_key():
    keys = shuffle_keys(5, "x.jsonl", np.arange(1000))
    assert len(np.unique(keys)) == 1000
    b = bucket_of(keys, 16)
    assert np.all(np.diff(b[np.argsort(keys)]) >= 0)  # buckets are key ranges


def test_shuffle_is_uniform_over_permutations():
    """All 24 orders of 4 records appear equally often over many seeds (chi-square, 23 dof)."""
    seeds = 4800
    counts = Counter(tuple(np.argsort(shuffle_keys(s, "a.jsonl", np.arange(4)))) for s in range(seeds))
    assert len(counts) == 24
    expected = seeds / 24
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 49.7  # p = 0.001 for 23 degrees of freedom


def test_each_position_uniform_for_a_larger_set():
    n, seeds = 10, 3000
    pos = np.zeros((n, n))
    for s in range(seeds):
        order = np.argsort(shuffle_keys(s, "b", np.arange(n)))
        pos[order, np.arange(n)] += 1
    expected = seeds / n
    chi2 = ((pos - expected) ** 2 / expected).sum()
    assert chi2 < 150  # (n-1)^2 = 81 dof, p ≈ 1e-5


def test_split_draws_ignore_the_seed_and_match_fractions():
    draws = split_draws("c.jsonl", np.arange(100_000))
    split = assign_splits(draws, parse_splits("train=0.9,val=0.05,test=0.05"))
    frac = np.bincount(split, minlength=3) / len(split)
    assert np.allclose(frac, [0.9, 0.05, 0.05], atol=0.005)


def test_mix64_is_a_bijection_on_a_sample():
    x = np.arange(1 << 16, dtype=np.uint64)
    assert len(np.unique(mix64(x))) == len(x)


def test_bucket_count_grows_with_data():
    assert bucket_count(10, 10**9) == 1
    assert bucket_count(10**9, 256 * 10**6) == 16
    assert math.log2(bucket_count(10**12, 10**6)) == 16


def test_the_part_files_follow_the_ranks_not_the_corpus_while_memory_allows():
    """A task (one part file) is a sixteenth of a rank's share: 1 TB and 10 TB on 100 ranks give
    the same 1,600 parts when --memory allows tasks that size; past --memory / 8 the parts grow."""
    GB = 1 << 30
    for corpus in (GB << 10, 10 * GB << 10):
        size = task_size(memory=64 * GB, world=100, input_bytes=corpus)
        assert corpus // size == 16 * 100
    assert task_size(memory=1 * GB, world=100, input_bytes=10 * GB << 10) == GB // 8  # (--memory 1GB)
    assert task_size(memory=1 * GB, world=1, input_bytes=10 << 20) == 1 << 20  # small inputs: 1 MB tasks
    assert task_size(memory=256 << 10, world=1, input_bytes=10 << 20) == 64 << 10  # a tiny budget
    assert Sizing.of(memory=64 * GB, workers=8, input_bytes=GB << 10, world=10).chunk_bytes == \
        Sizing.of(memory=64 * GB, workers=2, input_bytes=GB << 10, world=10).chunk_bytes  # not from --workers


def test_a_reader_opens_each_part_once_for_all_its_groups(tmp_path):
    """Every group reads a segment of most parts: one reader (a gather range) opens each once, and
    with fewer descriptors than parts it reads the same bytes (the rest opened for their read)."""
    table = groups(tmp_path, [60, 60, 60], seed=3, n_buckets=16, cut=20, budget=200)
    paths = {g.path(i) for g in table for i in range(len(g))}
    assert len(table) > 4 and len(paths) == 9
    with OpenParts() as kept, OpenParts(limit=3) as few:
        a = [bytes(sort_group(g, parts=kept).payload) for g in table]
        b = [bytes(sort_group(g, parts=few).payload) for g in table]
    assert a == b
    assert kept.opens == len(paths)
    assert few.opens > len(paths)  # the parts past its three opened for each read


def test_sample_keys_hold_no_dots_or_slashes():
    from shardsmith.core.sample import Identity

    ident = Identity("train/n01440764/img.0001.JPEG", 12)
    assert ident.key().startswith("train_n01440764_img_0001_JPEG-r12-") and len(ident.key()) < 80
    assert "." not in ident.key(copy=2) and "/" not in ident.key(copy=2)
    assert Identity("a.b", 0).key() != Identity("a_b", 0).key()  # cleaned alike, still distinct


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 400), min_size=1, max_size=12), shape=st.sampled_from([(), (3,), (2, 2)]),
       dtype=st.sampled_from(["<u1", "<f4", "<f8"]), data=st.data())
def test_take_ragged_equals_concatenating_the_records(lengths, shape, dtype, data):
    """Records of rows of any shape, picked in any order with repeats, from back-to-back records or
    from given starts, short ones (one index per row) and long ones (one slice each) alike."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    flat = np.arange(int(lengths.sum()) * int(np.prod(shape, dtype=np.int64))).astype(dtype).reshape(-1, *shape)
    order = np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n)), dtype=np.int64)
    bounds = starts_of(lengths)
    want = [flat[bounds[i]:bounds[i + 1]] for i in order]
    got = take_ragged(flat, lengths, order)
    assert got.dtype == flat.dtype and got.shape[1:] == flat.shape[1:]
    assert np.array_equal(got, np.concatenate(want) if want else flat[:0])
    # the same records laid out in reverse, found through their starts
    back = np.concatenate([flat[bounds[i]:bounds[i + 1]] for i in reversed(range(n))])
    where = starts_of(lengths[::-1])[:-1][::-1]
    assert np.array_equal(take_ragged(back, lengths, order, starts=where), got)


def test_take_ragged_refuses_a_record_past_the_end():
    flat = np.zeros((1000, 3), np.float32)
    for rows in (2, 400):  # one index per row; one slice per record
        with pytest.raises((ValueError, IndexError)):
            take_ragged(flat, np.array([rows, rows]), np.array([0, 1]), starts=np.array([0, 999]))


def _rss_file_mb() -> float:
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("RssFile:"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_mapped_part_pages_stay_bounded(tmp_path: Path) -> None:
    """A gather that maps part files lets their pages go every `resident` bytes: mapping 96 MB of
    segments keeps the process's file-backed resident memory near the bound, not near 96 MB (it did
    grow by the whole split before, 14 GB at a 10 GB input), and the bytes read stay right."""
    from shardsmith.engine.shuffle.mapped import PartMaps

    part = tmp_path / "part.bin"
    seg_bytes, n = 8 << 20, 12
    data = np.random.default_rng(0).integers(0, 256, seg_bytes * n, dtype=np.uint8)
    data.tofile(part)
    maps = PartMaps(resident=16 << 20)
    before = _rss_file_mb()
    peak = 0.0
    for i in range(n):
        maps.bring_in(Segments.of([(str(part), i * seg_bytes, 0, seg_bytes)]))
        got = maps.source(str(part))[i * seg_bytes:(i + 1) * seg_bytes]
        assert int(got[::4096].astype(np.int64).sum()) == int(data[i * seg_bytes:(i + 1) * seg_bytes:4096]
                                                              .astype(np.int64).sum())
        peak = max(peak, _rss_file_mb() - before)
    assert peak < 40, f"{peak:.0f} MB of mapped part pages resident for a 16 MB bound"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_a_shard_copied_from_mapped_pages_lets_them_go(tmp_path: Path) -> None:
    """The HDF5 writer copies a shard's values out of the part files' mapped pages, then lets those
    pages go (``pages.let_go_views``): a view of a map loses its resident pages and keeps its bytes;
    an array of anonymous memory is left alone (letting it go would zero it)."""
    from shardsmith.core import pages
    from shardsmith.engine.shuffle.mapped import PartMaps

    part = tmp_path / "part.bin"
    data = np.random.default_rng(1).integers(0, 256, 32 << 20, dtype=np.uint8)
    data.tofile(part)
    src = PartMaps(resident=1 << 40).source(str(part))
    before = _rss_file_mb()
    copied = np.array(src[1000:])  # the writer's copy faults every page in
    assert _rss_file_mb() - before > 24
    anon = np.arange(1000, dtype=np.int64)
    pages.let_go_views([src[5:9], src[10:], anon[3:]])
    assert _rss_file_mb() - before < 4
    assert np.array_equal(anon, np.arange(1000)) and np.array_equal(copied, data[1000:])
    assert np.array_equal(src, data)


# -- the part file's footer (``engine/shuffle/partfile.py``) --------------------------------------------------


def _part(path: Path) -> Path:
    """A part of two splits, several buckets and two flushes (so a (split, bucket) has two segments)."""
    w = PartWriter(path, flush_bytes=1500)
    for lo in (0, 40):
        recs = np.arange(lo, lo + 40)
        keys = shuffle_keys(3, "f", recs)
        for split in (0, 1):
            for b in np.unique(bucket_of(keys, 4)):
                m = bucket_of(keys, 4) == b
                w.add(split=split, bucket=int(b), keys=keys[m], order=input_order(split, recs[m]),
                      lengths=np.full(int(m.sum()), 20), payload=bytes(20 * int(m.sum())))
    w.write({"task": 7, "records": 80})
    return path


def _rewrite(path: Path, change) -> None:
    """The part with its footer's parts changed by ``change(fields)`` (fields: index rows, directory,
    meta, the trailer's figures and magic), written back as they are (not sorted, not checked)."""
    from shardsmith.engine.shuffle.partfile import INDEX, TRAILER

    data = path.read_bytes()
    index_at, rows, splits, meta_len, magic = TRAILER.unpack(data[-TRAILER.size:])
    at = index_at + INDEX.itemsize * rows
    f = {"payload": data[:index_at], "rows": np.frombuffer(data[index_at:at], dtype=INDEX).copy(),
         "directory": np.frombuffer(data[at:at + 8 * (splits + 1)], dtype="<u8").copy(),
         "meta": data[at + 8 * (splits + 1):len(data) - TRAILER.size], "magic": magic, "trailer": None}
    change(f)
    body = f["rows"].tobytes() + f["directory"].tobytes() + f["meta"]
    trailer = f["trailer"] or (len(f["payload"]), len(f["rows"]), len(f["directory"]) - 1, len(f["meta"]), f["magic"])
    path.write_bytes(f["payload"] + body + TRAILER.pack(*trailer))


def _swap(f):
    f["rows"][[0, 1]] = f["rows"][[1, 0]]


def _far(f):
    f["rows"]["count"][2] = 1 << 40


def _outside(f):
    f["rows"]["offset"][-1] = len(f["payload"])  # the index's own place: not payload


def _split_moved(f):
    f["rows"]["split"][0] = 1


def _directory(f):
    f["directory"][0] = 1


def _rows_grown(f):
    f["trailer"] = (len(f["payload"]), len(f["rows"]) + 1, len(f["directory"]) - 1, len(f["meta"]), f["magic"])


def _old_magic(f):
    f["magic"] = b"SSPART01"


def _meta(f):
    f["meta"] = b"[1, 2"


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


@pytest.mark.parametrize("change, why", [
    (_swap, "not in (split, bucket, offset) order"), (_far, "outside its payload area"),
    (_outside, "outside its payload area"), (_split_moved, "disagrees with its directory"),
    (_directory, "not a cut of its index"), (_rows_grown, "does not add up"),
    (_old_magic, "not a whole shardsmith part file of this version"), (_meta, "meta is not a JSON object"), (_cut, None),
], ids=lambda x: getattr(x, "__name__", "")[1:] if callable(x) else None)
def test_a_torn_or_lying_footer_is_refused_in_one_line_naming_the_part(tmp_path, change, why):
    """Crafted footers: counts past the file, offsets outside the payload area, rows out of order or
    of another split, a directory or trailer that does not add up, an older part, a part cut short.
    Each is refused in one line that names the part, and the scatter's resume check takes none of
    them as finished (the task is redone)."""
    from shardsmith.engine.shuffle.partfile import FOOTERS, read_footer
    from shardsmith.engine.shuffle.scatter import finished_task

    path = _part(tmp_path / "part-000007.bin")
    good, rows = read_footer(path, rows=True)
    assert good.meta == {"task": 7, "records": 80} and rows is not None and len(rows) > 8
    if why is None:
        change(path)
        why = "not a whole shardsmith part file"
    else:
        _rewrite(path, change)
    with pytest.raises(DatasetError) as err:
        read_footer(path, rows=True)[0].meta  # noqa: B018 (the meta is parsed when asked for)
    assert str(err.value).startswith(f"{path}: ") and why in str(err.value) and "\n" not in str(err.value)
    FOOTERS.forget()
    from shardsmith.core.input_file import InputFile
    from shardsmith.kit.reader import Task

    task = Task(index=7, file=InputFile(path="f", rel="f", index=0, size=1), start=0, stop=1, first_record=0, nbytes=1)
    assert finished_task(str(tmp_path), task) is None


def test_a_footer_reads_its_meta_without_its_index_and_one_split_without_the_others(tmp_path):
    """The meta and the directory come without the index (a garbled index does not stop the meta),
    and the rows of one split are read alone, the same as those of the whole index."""
    from shardsmith.engine.shuffle.partfile import read_footer

    path = _part(tmp_path / "part-000007.bin")
    _, every = read_footer(path, rows=True)
    assert every is not None and list(np.unique(every["split"])) == [0, 1]
    footer, _ = read_footer(path)
    assert np.array_equal(footer.rows(1, 2), every[every["split"] == 1])
    assert np.array_equal(footer.rows(0, 1), every[every["split"] == 0])
    assert len(footer.rows(2, 5)) == 0  # a split this task has no sample of
    _rewrite(path, _swap)
    footer, _ = read_footer(path)
    assert footer.meta["task"] == 7
    assert len(footer.rows(1, 2)) == int((every["split"] == 1).sum())  # the garbled rows are split 0's
    with pytest.raises(DatasetError, match="order"):
        footer.rows(0, 1)


def test_the_gather_reads_each_footer_once_after_the_resume_check(tmp_path):
    """A gather unit checks every task's part for its meta (``finished_task``), then builds its
    tables from the same parts: one more open of each, for its index alone (the footer was parsed
    once); a cold table reads footer and index in one open."""
    import sys

    from shardsmith.core.input_file import InputFile
    from shardsmith.engine.shuffle.partfile import FOOTERS
    from shardsmith.engine.shuffle.scatter import _task_id, finished_task
    from shardsmith.kit.reader import Task

    f = InputFile(path="f", rel="f", index=0, size=1)
    tasks = [Task(index=i, file=f, start=i, stop=i + 1, first_record=0, nbytes=1) for i in range(3)]
    paths = []
    for t in tasks:
        w = PartWriter(tmp_path / f"part-{t.index:06d}.bin")
        keys = shuffle_keys(1, "f", np.arange(10))
        w.add(split=0, bucket=0, keys=keys, order=input_order(0, np.arange(10)), lengths=np.full(10, 3),
              payload=bytes(30))
        w.write({"task": t.index, "plan": _task_id(t), "records": 10})
        paths.append(str(w.path))
    opened: list[str] = []
    watch = str(tmp_path)

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], str) and args[0].startswith(watch):
            opened.append(args[0])

    sys.addaudithook(hook)
    FOOTERS.forget()
    assert all(finished_task(str(tmp_path), t, index=False) is not None for t in tasks)
    split_segments(paths, 1)
    assert sorted(opened) == sorted(paths * 2)
    opened.clear()
    FOOTERS.forget()
    table = split_segments(paths, 1)[0]
    watch = "\0"  # (the hook stays: it counts nothing more)
    assert sorted(opened) == sorted(paths) and table.segments.samples == 30


def test_a_split_table_holds_tens_of_bytes_a_segment(tmp_path):
    """The gather's tables hold a segment as columns (28 bytes), not as an object (~300 bytes):
    100,000 segments of synthetic parts, measured with tracemalloc."""
    import tracemalloc

    from shardsmith.engine.shuffle.partfile import footer_bytes

    rng = np.random.default_rng(0)
    paths = []
    for p in range(10):
        n = 10_000
        count = rng.integers(1, 4, n)
        rows = np.column_stack([np.zeros(n, np.int64), np.sort(rng.integers(0, 4096, n)), np.arange(n) * 1000,
                                count, count * 10]).astype(np.uint64)
        path = tmp_path / f"part-{p}.bin"
        with open(path, "wb") as fh:
            fh.truncate(n * 1000)
            fh.seek(n * 1000)
            fh.write(footer_bytes(rows, {"task": p}, payload_end=n * 1000))
        paths.append(str(path))
    tracemalloc.start()
    try:
        split = SplitGather.of("train", split_segments(paths, 1)[0], budget=64 << 10)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert split.segments.samples > 0 and split.groups > 10
    assert held / 100_000 < 40, f"{held / 100_000:.0f} bytes a segment"


_OPEN_LOG = '''
import os, sys
_log = os.environ["SHARDSMITH_TEST_OPENS"]
def _hook(event, args):
    if event == "open" and args and isinstance(args[0], str) and os.path.basename(args[0]).startswith("part-"):
        with open(_log, "a") as fh:  # (a part's name only: this open is not one)
            fh.write(f"{os.getpid()} {args[0]}\\n")
sys.addaudithook(_hook)
'''


def test_a_gather_with_workers_opens_each_part_once_for_all_its_ranges(tmp_path, bpe_tokenizer):
    """Two gather workers, several shard ranges: every part file the gather reads is opened once, in
    the parent before the workers fork (they read and punch through the descriptors they inherit):
    no more opens of a part than with one worker, and the same output."""
    import os
    import subprocess
    import sys

    from conftest import make_docs, tree_digest, write_jsonl

    docs = make_docs(400, seed=5)
    for k in range(4):  # a task (a part file) each at least
        write_jsonl(tmp_path / "in" / f"{k}.jsonl", docs[k::4])
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(_OPEN_LOG)
    opens, outs = {}, {}
    for workers in (2, 1):
        log = tmp_path / f"opens{workers}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "hook"), *sys.path]),
               "SHARDSMITH_TEST_OPENS": str(log)}
        out = tmp_path / f"out{workers}"
        res = subprocess.run([sys.executable, "-m", "shardsmith", "pack-tokens", tmp_path / "in", "--tokenizer",
                              bpe_tokenizer, "-o", out, "--shard-tokens", "2000", "--memory", "256kB", "--workers",
                              str(workers), "-q"], capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr
        outs[workers] = out
        by_part: dict[str, int] = {}
        for line in log.read_text().splitlines():
            path = line.split(" ", 1)[1]
            by_part[os.path.basename(path)] = by_part.get(os.path.basename(path), 0) + 1
        opens[workers] = by_part
    assert tree_digest(outs[2]) == tree_digest(outs[1])
    assert len(opens[2]) >= 4 and opens[2] == opens[1], opens
    # each part: the scatter's check that it is not there yet, its footer read once (the tables), the
    # plan's heads once, the gather once
    assert max(opens[2].values()) <= 4, opens
