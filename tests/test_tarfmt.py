"""tarfmt: deterministic ustar bytes that tarfile and GNU tar read, and a parser that trusts nothing."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import member_table, tar_archive
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardsmith.errors import DatasetError
from shardsmith.formats.webdataset import tarfmt
from shardsmith.formats.webdataset.tarfmt import (
    BLOCK,
    RECORD,
    check_headers,
    end_of_archive,
    member_header,
    parse_header,
    parse_members,
    parse_sample,
    sample_members,
    scan_samples,
)

SAMPLES = [
    ("000000", [("jpg", b"\xff\xd8" + bytes(range(256)) * 3), ("cls", b"3"), ("json", b'{"a": 1}')]),
    ("000001", [("txt", "über 東京".encode()), ("npy", b""), ("seg.png", b"x" * 512)]),
    ("k2", [("pyd", b"\x80\x04K\x01."), ("bin", memoryview(b"0123456789" * 100))]),
]


def build(samples=SAMPLES) -> tuple[bytes, list[int]]:
    return tar_archive(samples)


def expected_members(samples=SAMPLES) -> list[tuple[str, bytes]]:
    return [(f"{k}.{e}", bytes(d)) for k, fields in samples for e, d in fields]


def tarinfo_bytes(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uname, info.gname = size, 0, 0o644, "", ""
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


@pytest.mark.parametrize("name,size", [("a.jpg", 0), ("000001.json", 12345), ("ü" * 50, 7),
                                       ("x" * 100, 8**11 - 1)])
def test_header_is_what_tarfile_writes(name, size):
    assert member_header(name, size) == tarinfo_bytes(name, size)


@pytest.mark.parametrize("name,size", [("x" * 101, 1), ("ü" * 51, 1), ("", 1), ("a\x00b", 1), ("a.b", -1),
                                       ("a.b", 8**11)])
def test_header_refuses_what_ustar_cannot_hold(name, size):
    with pytest.raises(ValueError):
        member_header(name, size)


@pytest.mark.parametrize("key,ext", [("a.b", "jpg"), ("a/b", "jpg"), ("", "jpg"), ("k", ""), ("k", "a/b"),
                                     ("k", ".x")])
def test_sample_members_refuses_bad_keys(key, ext):
    with pytest.raises(ValueError):
        sample_members(key, [(ext, b"1")])


def test_sample_members_do_not_copy_data():
    data, view = b"abc" * 300, memoryview(bytearray(1024))
    parts = sample_members("k", [("a", data), ("b", view)])
    assert parts[1] is data and parts[4] is view and len(parts) == 5  # no padding after 1024 bytes
    assert [len(p) for p in parts] == [512, 900, 124, 512, 1024]


def test_end_of_archive_pads_to_records():
    for size in (0, 512, RECORD - 1024, RECORD - 512, RECORD, 5 * RECORD + 512):
        tail = end_of_archive(size)
        assert not tail.strip(b"\x00") and len(tail) >= 2 * BLOCK and (size + len(tail)) % RECORD == 0
    with pytest.raises(ValueError):
        end_of_archive(100)


def test_tarfile_reads_every_member():
    archive, _ = build()
    assert len(archive) % RECORD == 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
        members = tf.getmembers()
        got = [(m.name, tf.extractfile(m).read()) for m in members]
    assert got == expected_members()
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644 and m.isreg() for m in members)


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_gnu_tar_lists_and_extracts(tmp_path: Path):
    archive, _ = build()
    (tmp_path / "a.tar").write_bytes(archive)
    listed = subprocess.run(["tar", "tf", "a.tar"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert listed.stdout.splitlines() == [n for n, _ in expected_members()]
    assert listed.stderr == ""
    (tmp_path / "x").mkdir()
    subprocess.run(["tar", "xf", "../a.tar"], cwd=tmp_path / "x", check=True, capture_output=True)
    for name, data in expected_members():
        assert (tmp_path / "x" / name).read_bytes() == data


def test_parse_members_finds_each_sample():
    archive, offsets = build()
    for (key, fields), start, stop in zip(SAMPLES, offsets, offsets[1:]):
        members = parse_members(archive, start, stop, where="a.tar")
        assert [m[0] for m in members] == [f"{key}.{e}" for e, _ in fields]
        assert [archive[o:o + n] for _, o, n in members] == [bytes(d) for _, d in fields]
    # a range across two samples is just more members; the loader checks that keys agree
    assert len(parse_members(archive, offsets[0], offsets[2])) == 6


def test_parse_members_accepts_other_valid_ustar_headers():
    info = tarfile.TarInfo("k.txt")
    info.size, info.mtime, info.mode, info.uid, info.uname = 5, 1234567, 0o600, 1000, "someone"
    buf = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape") + b"hello".ljust(BLOCK, b"\x00")
    assert parse_members(buf, 0, len(buf)) == [("k.txt", BLOCK, 5)]


def header_with(data_size: int, **patch: bytes) -> bytes:
    """A header with fields overwritten and the checksum recomputed, so only the patched field is bad."""
    fields = {"name": (0, 100), "size": (124, 12), "type": (156, 1), "magic": (257, 8), "prefix": (345, 155),
              "mode": (100, 8)}
    block = bytearray(member_header("k.x", data_size))
    for key, value in patch.items():
        start, width = fields[key]
        block[start:start + width] = value.ljust(width, b"\x00")
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block) + bytes(-data_size % BLOCK + data_size)


@pytest.mark.parametrize("patch,match", [
    ({"type": b"5"}, "regular file"), ({"type": b"L"}, "regular file"), ({"magic": b"ustar  \x00"}, "ustar"),
    ({"prefix": b"dir"}, "prefix"), ({"size": b"9999"}, "octal"), ({"mode": b"0o644"}, "octal"),
    ({"size": b"12_4"}, "octal"), ({"size": b"+17"}, "octal"), ({"name": b"a/b.jpg"}, "'/'"),
    ({"name": b"k..jpg"}, "'..'"), ({"name": b"a\x00b.jpg"}, "NUL"), ({"name": b"\xff.jpg"}, "UTF-8"),
    ({"name": b""}, "empty"),
])
def test_parse_members_refuses_malformed_headers(patch, match):
    buf = header_with(4, **patch)
    with pytest.raises(DatasetError, match=match) as err:
        parse_members(buf, 0, len(buf), where="s.tar")
    assert "s.tar" in str(err.value) and "byte 0" in str(err.value)


def test_parse_members_refuses_bad_ranges_and_checksums():
    archive, offsets = build()
    for start, stop in [(0, 100), (1, 513), (-512, 512), (0, len(archive) + 512), (512, 512), (0, offsets[1] - 512)]:
        with pytest.raises(DatasetError):
            parse_members(archive, start, stop)
    with pytest.raises(DatasetError, match="end of archive"):
        parse_members(archive, offsets[-1], offsets[-1] + 1024)
    corrupt = bytearray(archive)
    corrupt[5] ^= 1
    with pytest.raises(DatasetError, match="checksum"):
        parse_members(bytes(corrupt), 0, offsets[1])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_parse_members_on_mutated_archives_raises_only_dataset_error(data):
    archive, offsets = build()
    buf = bytearray(archive)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, offsets[-1] - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    s = data.draw(st.integers(0, len(offsets) - 2))
    start, stop = offsets[s], offsets[data.draw(st.integers(s + 1, len(offsets) - 1))]
    try:
        members = parse_members(bytes(buf), start, stop)
    except DatasetError:
        return
    for name, offset, size in members:
        assert start + BLOCK <= offset and offset + size <= stop and "/" not in name


@settings(max_examples=150, deadline=None)
@given(buf=st.binary(max_size=3 * BLOCK), start=st.integers(-1024, 2048), stop=st.integers(-1024, 2048))
def test_parse_members_on_random_bytes_raises_only_dataset_error(buf, start, stop):
    with contextlib.suppress(DatasetError):
        parse_members(buf, start, stop)


# -- scan_samples: every sample of a shard at once, exactly as parse_sample one by one ------------


def scanned(buf, offsets, where="s.tar") -> tuple:
    got = scan_samples(buf, np.array(offsets, np.int64), where=where)
    assert all(a.dtype == np.int64 for a in (got.first, got.data, got.size, got.ext))
    return got.keys, got.first.tolist(), got.data.tolist(), got.size.tolist(), got.ext.tolist(), got.exts


def outcome(fn, *args, **kwargs) -> tuple:
    try:
        return "ok", fn(*args, **kwargs)
    except DatasetError as exc:
        return "error", str(exc)


def many_samples(n: int = 60, seed: int = 0) -> list:
    """Keys of several lengths (some not ASCII), 1 to 5 members, extensions with dots, empty members."""
    rng = np.random.default_rng(seed)
    exts = ["jpg", "cls", "json", "seg.png", "txt", "ü.bin", "x"]
    out = []
    for i in range(n):
        key = f"{'k' * int(rng.integers(1, 40))}{i:04d}" + ("東京" if i % 7 == 3 else "")
        chosen = rng.permutation(len(exts))[:int(rng.integers(1, 6))]
        out.append((key, [(exts[e], rng.bytes(int(rng.choice([0, 1, 511, 512, 513, 3000])))) for e in chosen]))
    return out


def tarfile_archive(samples, *, foreign=lambda i: True) -> tuple[bytes, list[int]]:
    """A shard written by Python's tarfile: other modes, owners, mtimes and user names than
    shardsmith's, still valid POSIX ustar, for samples where ``foreign(i)``; offsets as the writer's."""
    out, offsets = io.BytesIO(), []
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i, (key, fields) in enumerate(samples):
            offsets.append(tf.offset)
            for ext, data in fields:
                if foreign(i):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime, info.mode, info.uid, info.uname = len(data), 1700000000 + i, 0o600, 1000, "u"
                    tf.addfile(info, io.BytesIO(data))
                else:  # shardsmith's own bytes, appended through the same file object
                    for part in sample_members(key, [(ext, data)]):
                        tf.fileobj.write(bytes(part))
                        tf.offset += len(part)
        offsets.append(tf.offset)
    return out.getvalue(), offsets


@pytest.fixture
def count_slow(monkeypatch):
    """How many samples scan_samples hands to parse_sample (shardsmith's own bytes: none)."""
    calls = []
    real = tarfmt.parse_sample

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(tarfmt, "parse_sample", counting)
    return calls


def test_scan_equals_sample_by_sample_parse(count_slow):
    for samples in (SAMPLES, many_samples(), many_samples(300, seed=1)):
        archive, offsets = build(samples)
        want = member_table(archive, offsets)
        count_slow.clear()
        assert scanned(archive, offsets) == want
        assert count_slow == []  # all in numpy
        assert want[0] == [k for k, _ in samples] and want[5][:len(samples[0][1])] == [e for e, _ in samples[0][1]]
    assert scanned(b"", [0]) == ([], [0], [], [], [], [])


def test_scan_many_levels_and_blocks(monkeypatch, count_slow):
    """Past _FREE_LEVELS the few long samples go to parse_sample; blocks of samples join up."""
    counts = [1 + (i % 3) * 6 + (i == 5) * 40 for i in range(210)]  # 70 samples of 13 members, one of 53
    samples = [(f"s{i:03d}", [(f"e{j}", b"%d" % j) for j in range(c)]) for i, c in enumerate(counts)]
    archive, offsets = build(samples)
    want = member_table(archive, offsets)
    assert scanned(archive, offsets) == want
    assert count_slow == [offsets[5]]  # alone past level 13
    monkeypatch.setattr(tarfmt, "_SAMPLES", 16)
    count_slow.clear()
    assert scanned(archive, offsets) == want
    assert count_slow == [o for o, c in zip(offsets, counts) if c > tarfmt._FREE_LEVELS]  # few per block


def test_scan_reads_foreign_headers_through_parse_members(count_slow):
    samples = many_samples(40, seed=2)
    archive, offsets = tarfile_archive(samples, foreign=lambda i: i % 3 == 0)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:  # it is a tar as tarfile writes them
        assert [m.name for m in tf.getmembers()] == [f"{k}.{e}" for k, f in samples for e, _ in f]
        assert tf.getmembers()[0].uname == "u"
    assert scanned(archive, offsets) == member_table(archive, offsets)
    assert count_slow == offsets[:-1:3]  # the foreign samples, and only those


def patch_header(buf: bytearray, at: int, field: str, value: bytes, *, checksum: bool = True) -> None:
    """Overwrite one field of the header at byte ``at``; recompute its checksum unless told not to."""
    fields = {"name": (0, 100), "size": (124, 12), "type": (156, 1), "magic": (257, 8), "mtime": (136, 12)}
    start, width = fields[field]
    buf[at + start:at + start + width] = value.ljust(width, b"\x00")
    if checksum:
        buf[at + 148:at + 156] = b" " * 8
        buf[at + 148:at + 156] = b"%06o\x00 " % sum(buf[at:at + BLOCK])


def corrupt_cases():
    samples = many_samples(50, seed=3)
    archive, offsets = build(samples)
    members = [parse_sample(archive, s, e, offsets[-1])[1] for s, e in zip(offsets, offsets[1:])]
    j = next(i for i in range(20, 50) if len(members[i]) >= 3)  # in the middle; its first and last member
    head = offsets[j]
    last = members[j][-1][1] - BLOCK
    key = samples[j][0].encode()
    ext0 = samples[j][1][0][0].encode()

    def case(edit):
        buf = bytearray(archive)
        offs = list(offsets)
        edit(buf, offs)
        return bytes(buf), offs

    def flip(buf, offs):
        buf[head + 3] ^= 1

    def checksum(buf, offs):
        buf[last + 153] = ord("0") + (buf[last + 153] - ord("0") + 1) % 8

    def rekey(buf, offs):  # the same key in every member, not UTF-8
        for ext, data, _ in members[j]:
            patch_header(buf, data - BLOCK, "name", key[:-1] + b"\xff." + ext.encode())

    return {
        "bad checksum": case(checksum),
        "a name byte changed": case(flip),
        "bad size digit": case(lambda b, o: patch_header(b, head, "size", b"0000000008\x00")),
        "name with /": case(lambda b, o: patch_header(b, head, "name", key + b"/x." + ext0)),
        "extension with /": case(lambda b, o: patch_header(b, last, "name", key + b".a/b")),
        "name with ..": case(lambda b, o: patch_header(b, head, "name", key + b".." + ext0)),
        "NUL inside the name": case(lambda b, o: patch_header(b, last, "name", key + b"\x00." + ext0)),
        "NUL after the extension": case(lambda b, o: patch_header(b, last, "name", key + b".zz\x00x")),
        "name not UTF-8": case(lambda b, o: patch_header(b, last, "name", key[:-1] + b"\xff." + ext0)),
        "key not UTF-8": case(rekey),
        "extension not UTF-8": case(lambda b, o: patch_header(b, last, "name", key + b".\xc3")),
        "no extension": case(lambda b, o: patch_header(b, last, "name", key)),
        "empty extension": case(lambda b, o: patch_header(b, last, "name", key + b".")),
        "empty key": case(lambda b, o: patch_header(b, head, "name", b"." + ext0)),
        "another key": case(lambda b, o: patch_header(b, last, "name", b"zz.qq")),
        "repeated extension": case(lambda b, o: patch_header(b, last, "name", key + b"." + ext0)),
        "member runs past the sample end": case(
            lambda b, o: patch_header(b, last, "size", b"%011o" % (o[j + 1] - last))),
        "not a regular file": case(lambda b, o: patch_header(b, head, "type", b"5")),
        "not ustar": case(lambda b, o: patch_header(b, head, "magic", b"ustar  \x00")),
        "foreign with a bad checksum": case(lambda b, o: patch_header(b, head, "mtime", b"1", checksum=False)),
        "zero block in a sample": case(lambda b, o: b.__setitem__(slice(last, last + BLOCK), bytes(BLOCK))),
        "index cuts a sample": case(lambda b, o: o.__setitem__(j + 1, last)),
        "index range not whole blocks": case(lambda b, o: o.__setitem__(j + 1, o[j + 1] + 100)),
        "first sample inside a block": case(lambda b, o: o.__setitem__(0, 100)),
        "index range backwards": case(lambda b, o: o.__setitem__(j + 1, o[j] - BLOCK)),
        "index cuts a sample, then runs backwards": case(lambda b, o: o.__setitem__(slice(j + 1, j + 3), [last, head])),
    }, offsets[j], len(members[j])


@pytest.mark.parametrize("name", list(corrupt_cases()[0]))
def test_scan_raises_what_parse_sample_raises(name):
    cases, head, _ = corrupt_cases()
    buf, offsets = cases[name]
    want = outcome(member_table, buf, offsets)
    assert want[0] == "error" and want[1].startswith("s.tar: ") and "byte" in want[1], want
    assert outcome(scanned, buf, offsets) == want


def non_octal_digit_headers() -> list[bytes]:
    """Headers whose size or checksum has an 8 or 9 standing in for a carry: the right value, not octal."""
    out = []
    for i in range(200):
        block = bytearray(member_header(f"k{i}.x", 1))
        if len(out) < 2:
            block[124:135] = b"00000000009"  # 9 bytes: as many blocks as 1 byte
            block[148:156] = b" " * 8
            block[148:156] = b"%06o\x00 " % sum(block)
            out.append(bytes(block))
        total = sum(block[:148]) + 8 * 32 + sum(block[156:])
        if total % 8 < 2 and total // 8 % 8:  # ...a1 → ...(a-1)(8+1): same value
            digits = bytearray(b"%06o" % total)
            digits[4] -= 1
            digits[5] += 8
            block[148:154] = digits
            out.append(bytes(block))
        if len(out) == 4:
            return out
    raise AssertionError("no checksum ends in 0 or 1")


@pytest.mark.parametrize("header", non_octal_digit_headers())
def test_a_digit_that_is_not_octal_goes_to_the_parser(header):
    buf = header + bytes(BLOCK)
    want = outcome(parse_header, header, where="s.tar", offset=0)
    assert want[0] == "error" and ("octal" in want[1] or "checksum" in want[1])
    assert check_headers(np.frombuffer(buf, np.uint8).reshape(2, BLOCK), np.array([0]))[0].tolist() == [False]
    assert outcome(scanned, buf, [0, 2 * BLOCK]) == outcome(member_table, buf, [0, 2 * BLOCK])


def test_a_cut_index_is_caught_for_keys_that_are_not_ascii():
    samples = [("東京", [("a", b"1"), ("b", b"2")]), ("k", [("a", b"3")])]
    archive, offsets = build(samples)
    cut = [0, BLOCK * 2, offsets[-1]]  # sample 0 ends after its first member
    with pytest.raises(DatasetError, match="inside the sample"):
        parse_sample(archive, 0, cut[1], cut[-1])
    for fn in (member_table, scanned):
        with pytest.raises(DatasetError, match="inside the sample"):
            fn(archive, cut)


FUZZ_SAMPLES = many_samples(24, seed=4)
FUZZ_ARCHIVE, FUZZ_OFFSETS = build(FUZZ_SAMPLES)
FUZZ_HEADERS = [d - BLOCK for s, e in zip(FUZZ_OFFSETS, FUZZ_OFFSETS[1:])
                for _, d, _ in parse_sample(FUZZ_ARCHIVE, s, e, FUZZ_OFFSETS[-1])[1]]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_scan_on_mutated_shards_matches_sample_by_sample_parse(data):
    """Random bytes in headers (checksums fixed or not), random offsets: same table or same error."""
    buf, offsets = bytearray(FUZZ_ARCHIVE), list(FUZZ_OFFSETS)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["header", "header+checksum", "anywhere", "offset"]))
        if kind == "offset":
            i = data.draw(st.integers(0, len(offsets) - 1))
            offsets[i] = data.draw(st.sampled_from(FUZZ_OFFSETS + FUZZ_HEADERS) | st.integers(-1024, len(buf) + 1024))
            continue
        at = data.draw(st.sampled_from(FUZZ_HEADERS)) if kind != "anywhere" else 0
        pos = at + data.draw(st.integers(0, BLOCK - 1) if kind != "anywhere" else st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.sampled_from(b"./\x00\xc3\xff09a") | st.integers(0, 255))
        if kind == "header+checksum":
            buf[at + 148:at + 156] = b" " * 8
            buf[at + 148:at + 156] = b"%06o\x00 " % sum(buf[at:at + BLOCK])
    buf = bytes(buf)
    assert outcome(scanned, buf, offsets) == outcome(member_table, buf, offsets)


def test_check_headers_marks_only_shardsmith_headers():
    archive, offsets = build(many_samples(10))
    blocks = np.frombuffer(archive, np.uint8).reshape(-1, BLOCK)
    ok, size, names, length, dot = check_headers(blocks, np.array(offsets[:-1]) // BLOCK)
    want = [parse_members(archive, o, o + BLOCK + int(s) + (-int(s) % BLOCK))[0][0].encode() for o, s in zip(offsets, size)]
    assert ok.all() and [bytes(n).rstrip(b"\x00") for n in names] == want
    assert length.tolist() == [len(n) for n in want] and dot.tolist() == [n.index(b".") for n in want]
    foreign = tarinfo_bytes("k.txt", 5)[:BLOCK]
    foreign = bytearray(foreign)
    foreign[136:148] = b"00000000001\x00"  # another mtime: valid ustar, not shardsmith's
    foreign[148:156] = b" " * 8
    foreign[148:156] = b"%06o\x00 " % sum(foreign)
    assert parse_header(bytes(foreign), where="x", offset=0) == ("k.txt", 5)
    two = np.frombuffer(member_header("k.txt", 5) + bytes(foreign), np.uint8).reshape(2, BLOCK)
    assert check_headers(two, np.array([0, 1]))[0].tolist() == [True, False]
    with pytest.raises(ValueError):
        check_headers(two, np.array([2]))
