"""Issue 5's bad-input matrix, run through the CLI as a user runs it: one line on stderr naming the
file (and line or record), the documented exit code, no traceback, no manifest; ``--on-error skip``
runs finish and account for every record read (docs/design.md, "Guarantees" 1)."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Result, jpeg, make_docs, root_data, run_cli, write_jsonl

from shardsmith.demo.icecube_like import make_icecube_kaggle_like

MANIFEST = "manifest.json"


def fails_in_one_line(res: Result, out: Path, *names: str, code: int = 1) -> str:
    """The common checks of a failed run; returns the message."""
    err = res.stderr.strip()
    assert res.exit_code == code, (res.exit_code, res.stderr)
    assert "Traceback" not in res.stderr and "\n" not in err, res.stderr
    assert err.startswith("shardsmith: error: "), err
    for name in names:
        assert name in err, (name, err)
    assert not (out / MANIFEST).exists(), "a failed run must not look like a dataset"
    if out.is_dir():
        assert not [p.name for p in out.iterdir() if ".tmp-" in p.name], "temporary files left behind"
    return err


def manifest_of(out: Path) -> dict[str, Any]:
    return json.loads((out / MANIFEST).read_text())


def written(m: dict[str, Any]) -> int:
    """Records written: events for event datasets, samples otherwise."""
    return sum(s.get("events", s["samples"]) for s in m["splits"].values())


def accounted(m: dict[str, Any]) -> None:
    """Guarantee 1: records read = samples written + records skipped."""
    src = m["source"]
    assert src["records"] == written(m) + src["skipped"]["count"], src
    assert src["skipped"]["count"] == len(src["skipped"]["records"])


# -- JSONL into tar ---------------------------------------------------------------------------------

def jsonl_with(tmp_path: Path, bad_line: bytes, *, at: int = 3) -> Path:
    lines = [json.dumps({"text": d}).encode() for d in make_docs(10)]
    lines.insert(at, bad_line)
    root = tmp_path / "in"
    root.mkdir()
    (root / "data.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return root


@pytest.mark.parametrize("line, reason", [
    (b'{"text": "caf\xe9"}', "invalid UTF-8"),
    (b'{"text": "\xff\xfe"}', "invalid UTF-8"),
    (b'{"text": "unterminated', "malformed JSON"),
    (b'[1, 2]', "expected a JSON object"),
])
def test_bad_jsonl_line_into_webdataset(tmp_path, line, reason):
    root = jsonl_with(tmp_path, line)
    out = tmp_path / "out"
    res = run_cli("convert", root, "-o", out, "--to", "webdataset", "-q", "--workers", "1")
    fails_in_one_line(res, out, "data.jsonl: line 4:", reason)
    assert not list(out.glob("*.tar"))
    res = run_cli("convert", root, "-o", tmp_path / "skip", "--to", "webdataset", "-q", "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    m = manifest_of(tmp_path / "skip")
    accounted(m)
    assert m["source"]["records"] == 11 and written(m) == 10
    (entry,) = m["source"]["skipped"]["records"]
    assert entry["file"] == "data.jsonl" and entry["line"] == 4 and reason in entry["reason"]


def test_missing_text_field_into_webdataset_is_named_by_line(tmp_path):
    root = jsonl_with(tmp_path, b'{"body": "no text"}', at=6)
    out = tmp_path / "out"
    res = run_cli("convert", root, "-o", out, "--to", "webdataset", "-q", "--text-field", "text")
    fails_in_one_line(res, out, "data.jsonl: line 7:", "'text'")


# -- empty inputs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["zero bytes", "blank lines"])
def test_an_empty_jsonl_file(tmp_path, content):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.jsonl").write_bytes(content)
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "webdataset", "-q")
    fails_in_one_line(res, out, "empty.jsonl", "nothing to write")


def test_an_empty_jsonl_beside_good_ones_is_fine(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(5))
    (tmp_path / "in" / "b.jsonl").write_bytes(b"")
    res = run_cli("convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "webdataset", "-q")
    assert res.exit_code == 0, res.stderr
    m = manifest_of(tmp_path / "out")
    accounted(m)
    assert m["source"]["records"] == 5 == written(m)


def test_a_parquet_file_with_zero_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "n": pa.array([], pa.int64())}),
                   tmp_path / "in" / "none.parquet")
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "webdataset", "-q")
    fails_in_one_line(res, out, "none.parquet", "nothing to write")


def test_parquet_events_with_zero_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"event_id": pa.array([], pa.int64()), "t": pa.array([], pa.float32())}),
                   tmp_path / "in" / "none.parquet")
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "hdf5", "--group-by", "event_id", "-q")
    fails_in_one_line(res, out, "none.parquet", "nothing to write")


def test_an_empty_input_does_not_block_the_next_command(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.jsonl").write_bytes(b"")
    out = tmp_path / "out"
    assert run_cli("convert", tmp_path / "in", "-o", out, "--to", "webdataset", "-q").exit_code == 1
    write_jsonl(tmp_path / "in" / "empty.jsonl", make_docs(3))
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "webdataset", "-q", "--seed", "7")
    assert res.exit_code == 0, res.stderr


def test_an_image_folder_without_images(tmp_path):
    for cls in ("ant", "bee"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        (tmp_path / "imgs" / cls / "notes.txt").write_text("not an image\n")
        (tmp_path / "imgs" / cls / "labels.txt").write_text("1\n")
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "imgs", "-o", out, "--to", "webdataset", "-q")
    fails_in_one_line(res, out, "imgs", "no input files", code=2)
    res = run_cli("convert", tmp_path / "imgs", "-o", out, "--to", "webdataset", "-q", "--from", "imagefolder")
    fails_in_one_line(res, out, "imgs", "no input files", code=2)


# -- ROOT and Parquet events into HDF5 ---------------------------------------------------------------

def test_a_root_tree_without_entries(tmp_path):
    out = tmp_path / "out"
    res = run_cli("convert", root_data() / "uproot-empty.root", "-o", out, "--to", "hdf5", "-q")
    fails_in_one_line(res, out, "uproot-empty.root", "nothing to write")


@pytest.mark.parametrize("args, names", [
    (["--tree", "nope"], ["uproot-HZZ.root", "--tree 'nope'", "events"]),
    (["--branches", "Jet_Px,Tau_*"], ["uproot-HZZ.root", "'Tau_*'"]),
], ids=["no such tree", "no such branch"])
@pytest.mark.parametrize("skip", [False, True], ids=["fail", "skip"])
def test_root_without_the_tree_or_branch(tmp_path, args, names, skip):
    out = tmp_path / "out"
    res = run_cli("convert", root_data() / "uproot-HZZ.root", "-o", out, "--to", "hdf5", "-q", *args,
                  *(["--on-error", "skip"] if skip else []))
    fails_in_one_line(res, out, *names, code=2)  # an option that matches nothing: a usage error, never skipped


@pytest.mark.parametrize("skip", [False, True], ids=["fail", "skip"])
def test_a_truncated_root_file(tmp_path, skip):
    src = (root_data() / "uproot-HZZ.root").read_bytes()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "cut.root").write_bytes(src[: len(src) * 2 // 3])
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "hdf5", "-q",
                  *(["--on-error", "skip"] if skip else []))
    # skip or not, a lone file that cannot be opened leaves nothing to convert
    err = fails_in_one_line(res, out, "cut.root", *([] if skip else ["not a readable ROOT file"]))
    assert str(tmp_path) not in err, "named by its path relative to the input, as everywhere"


def test_parquet_event_files_whose_schemas_disagree(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"event_id": [1, 1, 2], "t": pa.array([1.0, 2.0, 3.0], pa.float64())}),
                   tmp_path / "in" / "a.parquet")
    pq.write_table(pa.table({"event_id": [3, 4], "t": pa.array([1.0, 2.0], pa.float32())}),
                   tmp_path / "in" / "b.parquet")
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "hdf5", "--group-by", "event_id", "-q")
    fails_in_one_line(res, out, "b.parquet", "a.parquet", "'t'")
    pq.write_table(pa.table({"event_id": [3, 4], "q": pa.array([1.0, 2.0])}), tmp_path / "in" / "b.parquet")
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "hdf5", "--group-by", "event_id", "-q")
    fails_in_one_line(res, out, "b.parquet", "a.parquet")


# -- a full disk --------------------------------------------------------------------------------------

_REAL_OPEN = builtins.open


class _FullDisk(io.RawIOBase):
    """A file on a disk with ``room`` bytes left: writes past it fail as write(2) does (ENOSPC, no
    file name). Wrapped in a real ``BufferedWriter``, so buffering, flush-on-close and fsync behave
    as they do on a real full disk."""

    def __init__(self, path: Any, room: int) -> None:
        self._raw = _REAL_OPEN(path, "wb", buffering=0)
        self.room = room
        self.name = os.fspath(path)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = min(len(memoryview(data).cast("B")), self.room)
        if n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= n
        return self._raw.write(memoryview(data).cast("B")[:n])

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def fill_disk(monkeypatch: pytest.MonkeyPatch, module: Any, match: str, *, room: int = 0) -> None:
    """Files that ``module`` opens for writing whose path contains ``match`` land on a full disk."""

    def fake_open(file: Any, mode: str = "r", buffering: int = -1, *args: Any, **kw: Any) -> Any:
        if "w" in mode and "b" in mode and match in os.fspath(file):
            return io.BufferedWriter(_FullDisk(file, room), buffer_size=buffering if buffering > 1 else 8192)
        return _REAL_OPEN(file, mode, buffering, *args, **kw)

    monkeypatch.setattr(module, "open", fake_open, raising=False)


def full_disk_checks(res: Result, out: Path, *, work_removed: bool = True) -> str:
    err = fails_in_one_line(res, out, "No space left on device")
    assert str(out.parent) in err, f"the message names no file: {err}"
    left = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    assert not [n for n in left if n.startswith(".") and "tmp" in n], left  # no partial temporary files
    if work_removed:
        assert not (out.parent / f".{out.name}.shardsmith-work").exists(), "a failed run's spill folder is removed"
    return err


@pytest.mark.parametrize("room", [0, 3000], ids=["nothing fits", "part of a shard fits"])
def test_full_disk_while_writing_token_shards(tmp_path, bpe_tokenizer, monkeypatch, room):
    import shardsmith.core.fsutil as fsutil

    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(200))
    fill_disk(monkeypatch, fsutil, "train-", room=room)
    out = tmp_path / "out"
    res = run_cli("pack-tokens", tmp_path / "in", "-o", out, "--tokenizer", bpe_tokenizer, "-q", "--workers", "1")
    err = full_disk_checks(res, out)
    assert "train-000000.bin" in err
    assert not list(out.glob("train-*")), "no shard under its final name"


@pytest.mark.parametrize("room", [0, 30_000], ids=["nothing fits", "part of a shard fits"])
def test_full_disk_while_writing_tar_shards(tmp_path, monkeypatch, room):
    import shardsmith.core.fsutil as fsutil

    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(300))
    fill_disk(monkeypatch, fsutil, "train-", room=room)
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "webdataset", "-q", "--workers", "1")
    err = full_disk_checks(res, out)
    assert "train-000000.tar" in err
    assert not list(out.glob("train-*"))


def test_full_disk_while_writing_image_shards(tmp_path, monkeypatch):
    import shardsmith.core.fsutil as fsutil

    for i in range(6):
        (tmp_path / "imgs" / "cls").mkdir(parents=True, exist_ok=True)
        (tmp_path / "imgs" / "cls" / f"{i}.jpg").write_bytes(jpeg(i))
    fill_disk(monkeypatch, fsutil, "train-", room=4000)
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "imgs", "-o", out, "--to", "webdataset", "-q", "--workers", "1")
    full_disk_checks(res, out)
    assert not list(out.glob("train-*"))


def fill_disk_writev(monkeypatch: pytest.MonkeyPatch, match: str, *, room: int) -> None:
    """``os.writev`` to files whose path contains ``match`` lands on a full disk: a write takes what
    still fits (a short count, as the kernel returns), the next one fails with ENOSPC."""
    real = os.writev
    left = [room]

    def fake_writev(fd: int, buffers: Any) -> int:
        if match not in os.readlink(f"/proc/self/fd/{fd}"):
            return real(fd, buffers)
        data = b"".join(bytes(memoryview(b).cast("B")) for b in buffers)
        n = min(len(data), left[0])
        if n == 0 and data:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left[0] -= n
        return os.write(fd, data[:n])

    monkeypatch.setattr(os, "writev", fake_writev)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a descriptor's file through Linux's /proc")
def test_full_disk_while_spilling(tmp_path, monkeypatch):
    """Part files are written with writev: the disk fills in the middle of one (a short write, then
    ENOSPC), and the run stops with one line that names the part."""
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(300))
    fill_disk_writev(monkeypatch, "part-", room=5000)
    out = tmp_path / "out"
    res = run_cli("convert", tmp_path / "in", "-o", out, "--to", "webdataset", "-q", "--workers", "1",
                  "--memory", "64KB")
    err = full_disk_checks(res, out)
    assert "part-000000.bin" in err
    assert not list(out.glob("train-*"))


def test_full_disk_while_writing_event_shards(tmp_path, monkeypatch):
    """h5py writes in C, past any Python patch: its write fails as HDF5 reports a full disk."""
    import shardsmith.formats.hdf5.writer as hdf5

    batches, _ = make_icecube_kaggle_like(tmp_path / "ic", batches=1, events_per_batch=40, mean_pulses=5, seed=1)
    real_build = hdf5.HDF5Writer._build

    def build_fails(self: Any, path: Path) -> None:
        real_build(self, path)  # a whole temporary file, then the failure (as in a final flush)
        raise OSError(errno.ENOSPC, "Can't synchronously write data (file write failed: No space left on device)")

    monkeypatch.setattr(hdf5.HDF5Writer, "_build", build_fails)
    out = tmp_path / "out"
    res = run_cli("convert", *batches, "-o", out, "--to", "hdf5", "--group-by", "event_id", "-q", "--workers", "1")
    err = full_disk_checks(res, out)
    assert "train-000000.h5" in err
    assert not list(out.glob("train-*"))


def test_full_disk_while_writing_the_manifest(tmp_path, monkeypatch):
    import shardsmith.core.fsutil as fsutil

    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(20))
    fill_disk(monkeypatch, fsutil, MANIFEST, room=100)
    out = tmp_path / "out"
    args = ("convert", tmp_path / "in", "-o", out, "--to", "webdataset", "-q", "--workers", "1")
    # every shard is whole by now: the finished work is kept, as after a kill, for the rerun to reuse
    err = full_disk_checks(run_cli(*args), out, work_removed=False)
    assert str(out / MANIFEST) in err
    monkeypatch.undo()  # space freed: the same command finishes the dataset
    res = run_cli(*args)
    assert res.exit_code == 0, res.stderr
    m = manifest_of(out)
    accounted(m)
    assert written(m) == 20


# -- an unreadable file ---------------------------------------------------------------------------------

_NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def unreadable(path: Path) -> list[str]:
    """chmod 000 ``path``; returns the command prefix under which that really blocks reading.

    A normal user needs none. root reads anything through CAP_DAC_OVERRIDE, so as root the run
    goes through ``setpriv`` with that capability (and DAC_READ_SEARCH) dropped: a real EACCES from
    the kernel, for every reader (pyarrow and uproot open files in C or on their own, past any
    Python patch). Skips if neither works.
    """
    path.chmod(0)
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        return []
    if shutil.which("setpriv"):
        probe = subprocess.run([*_NO_DAC, "cat", str(path)], capture_output=True, text=True)
        if probe.returncode != 0 and "Permission denied" in probe.stderr:
            return _NO_DAC
    pytest.skip("running as root without a way to drop CAP_DAC_OVERRIDE (setpriv): chmod 000 blocks nothing")


def run_as(prefix: list[str], *args: str | Path) -> Result:
    """The CLI in a subprocess (real exit code), under ``prefix``."""
    res = subprocess.run([*prefix, sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True,
                         text=True, timeout=120)
    return Result(res.returncode, res.stdout, res.stderr)


def test_an_unreadable_jsonl_file(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(8))
    write_jsonl(tmp_path / "in" / "locked.jsonl", make_docs(5, seed=1))
    prefix = unreadable(tmp_path / "in" / "locked.jsonl")
    out = tmp_path / "out"
    res = run_as(prefix, "convert", tmp_path / "in", "-o", out, "--to", "webdataset", "-q", "--workers", "2")
    fails_in_one_line(res, out, "locked.jsonl", "Permission denied")
    assert not list(out.glob("*.tar"))
    res = run_as(prefix, "convert", tmp_path / "in", "-o", tmp_path / "skip", "--to", "webdataset", "-q",
                 "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    m = manifest_of(tmp_path / "skip")
    accounted(m)
    assert m["source"]["records"] == 8 == written(m)
    (entry,) = m["source"]["unread"]
    assert entry["file"] == "locked.jsonl" and "Permission denied" in entry["reason"]


def test_an_unreadable_image(tmp_path):
    for i in range(6):
        (tmp_path / "imgs" / ("a" if i % 2 else "b")).mkdir(parents=True, exist_ok=True)
        (tmp_path / "imgs" / ("a" if i % 2 else "b") / f"{i}.jpg").write_bytes(jpeg(i))
    prefix = unreadable(tmp_path / "imgs" / "a" / "3.jpg")
    out = tmp_path / "out"
    res = run_as(prefix, "convert", tmp_path / "imgs", "-o", out, "--to", "webdataset", "-q")
    fails_in_one_line(res, out, "a/3.jpg", "Permission denied")
    assert not list(out.glob("*.tar"))
    res = run_as(prefix, "convert", tmp_path / "imgs", "-o", tmp_path / "skip", "--to", "webdataset", "-q",
                 "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    m = manifest_of(tmp_path / "skip")
    accounted(m)
    assert m["source"]["records"] == 6 and written(m) == 5
    (entry,) = m["source"]["skipped"]["records"]
    assert entry["file"] == "a/3.jpg" and "Permission denied" in entry["reason"]


def test_an_unreadable_parquet_events_file(tmp_path):
    batches, _ = make_icecube_kaggle_like(tmp_path / "ic", batches=2, events_per_batch=20, mean_pulses=4, seed=2)
    prefix = unreadable(batches[1])
    out = tmp_path / "out"
    res = run_as(prefix, "convert", *batches, "-o", out, "--to", "hdf5", "--group-by", "event_id", "-q")
    fails_in_one_line(res, out, "batch_2.parquet", "Permission denied")


def test_an_unreadable_root_file(tmp_path):
    (tmp_path / "in").mkdir()
    locked = tmp_path / "in" / "locked.root"
    locked.write_bytes((root_data() / "uproot-HZZ.root").read_bytes())
    prefix = unreadable(locked)
    out = tmp_path / "out"
    res = run_as(prefix, "convert", locked, "-o", out, "--to", "hdf5", "-q")
    err = fails_in_one_line(res, out, "locked.root: cannot open: Permission denied")
    assert "corrupt" not in err, "a file we may not read is not a damaged file"


def test_an_unreadable_file_for_pack_tokens(tmp_path, bpe_tokenizer):
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(8))
    write_jsonl(tmp_path / "in" / "locked.jsonl", make_docs(5, seed=1))
    prefix = unreadable(tmp_path / "in" / "locked.jsonl")
    out = tmp_path / "out"
    res = run_as(prefix, "pack-tokens", tmp_path / "in", "-o", out, "--tokenizer", bpe_tokenizer, "-q")
    fails_in_one_line(res, out, "locked.jsonl", "Permission denied")
