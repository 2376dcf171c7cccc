"""``Reader.record_offsets``: where each record's line starts in a plain JSONL file (what
``--provenance`` records), for any task plan; compressed JSONL and Parquet have none."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from shardsmith.core.input_file import InputFile
from shardsmith.kit.reader import MultiReader
from shardsmith.sources.jsonl import JsonlReader, line_starts
from shardsmith.sources.parquet import ParquetReader


def input_file(path: Path) -> InputFile:
    return InputFile(path=str(path), rel=path.name, size=path.stat().st_size, index=0)


def lines_with_blanks(n: int) -> list[bytes]:
    """Records of varied length, with blank and whitespace-only lines among them (lines all the same)."""
    out = []
    for i in range(n):
        out.append(b"" if i % 7 == 3 else b"   " if i % 11 == 5 else json.dumps({"text": "w" * (i * 37 % 300)}).encode())
    return out


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 20])
@pytest.mark.parametrize("trailing", [True, False])
def test_offsets_are_where_each_read_record_starts(tmp_path, chunk, trailing):
    lines = lines_with_blanks(200)
    data = b"\n".join(lines) + (b"\n" if trailing else b"")
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    f = input_file(path)
    reader = JsonlReader()
    tasks = reader.plan([f], chunk_bytes=chunk)
    assert (len(tasks) > 1) == (chunk < len(data))
    starts = np.concatenate([[0], np.cumsum([len(x) + 1 for x in lines])])
    seen = []
    for task in tasks:
        records = np.array([r for r, _ in reader.read(task)], dtype=np.int64)
        got = reader.record_offsets(task, records)
        assert got is not None and got.dtype == np.int64
        assert got.tolist() == starts[records].tolist()
        for r, at in zip(records.tolist(), got.tolist()):  # the line there is the record read
            assert data[at:].split(b"\n", 1)[0] == lines[r]
        seen += records.tolist()
    assert seen == [i for i, x in enumerate(lines) if x.strip()]  # blank lines count, and are not records


def test_a_subset_of_records_and_small_blocks(tmp_path):
    lines = lines_with_blanks(300)
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    starts = np.concatenate([[0], np.cumsum([len(x) + 1 for x in lines])])
    wanted = np.array([0, 1, 2, 50, 51, 200, 299])
    assert line_starts(str(path), start=0, stop=-1, wanted=wanted, block=16).tolist() == starts[wanted].tolist()
    assert line_starts(str(path), start=0, stop=-1, wanted=np.zeros(0, np.int64)).tolist() == []
    # a range that ends before a line asked for: None (the file changed)
    assert line_starts(str(path), start=0, stop=int(starts[10]), wanted=np.array([10, 12])) is None


def test_compressed_jsonl_and_parquet_have_no_offsets(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    gz = tmp_path / "a.jsonl.gz"
    with gzip.open(gz, "wb") as fh:
        fh.write(b'{"text": "a"}\n{"text": "b"}\n')
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "b.parquet")
    multi = MultiReader(readers=[JsonlReader(), ParquetReader.for_text("text")])
    for f in (input_file(gz), input_file(tmp_path / "b.parquet")):
        (task,) = multi.plan([f], chunk_bytes=1 << 20)
        assert multi.record_offsets(task, np.array([0, 1])) is None
    plain = tmp_path / "c.jsonl"
    plain.write_bytes(b'{"text": "a"}\n\n{"text": "b"}\n')
    (task,) = multi.plan([input_file(plain)], chunk_bytes=1 << 20)
    assert multi.record_offsets(task, np.array([0, 2])).tolist() == [0, 15]


def test_batch_after_batch_of_a_task_reads_on_from_the_last_line(tmp_path):
    """The scatter asks batch by batch: each call goes on from where the last one stopped, and a
    call that goes back (another task, an earlier record) starts at the task's beginning again."""
    lines = lines_with_blanks(500)
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    starts = np.concatenate([[0], np.cumsum([len(x) + 1 for x in lines])])
    reader = JsonlReader()
    tasks = reader.plan([input_file(path)], chunk_bytes=4000)
    assert len(tasks) > 3
    for task in [*tasks, tasks[1], tasks[0]]:
        records = np.array([r for r, _ in reader.read(task)], dtype=np.int64)
        for part in (records[:1], records[1:4], records[4:4], records[4:17], records[17:]):
            got = reader.record_offsets(task, part)
            assert got.tolist() == starts[part].tolist()
        assert reader.record_offsets(task, records[:2]).tolist() == starts[records[:2]].tolist()  # back again
