"""Readers: JSONL cut into line-aligned tasks, record numbering, compressed streams."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.engine.inputs.files import discover
from shardsmith.sources.jsonl import JsonlReader, _cut_at_lines


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=40),
       trailing=st.booleans(), chunk=st.integers(1, 60), block=st.integers(1, 25))
def test_cuts_end_at_newlines_and_know_their_first_line(tmp_path_factory, lines, trailing, chunk, block):
    data = b"\n".join(lines) + (b"\n" if trailing else b"")
    path = tmp_path_factory.mktemp("cut") / "f.jsonl"
    path.write_bytes(data)
    cuts = _cut_at_lines(str(path), chunk, block=block)
    if not data:
        assert cuts == []
        return
    assert cuts[0][0] == 0 and cuts[-1][1] == len(data)
    for (start, stop, first), nxt in zip(cuts, cuts[1:] + [None]):
        assert stop > start and data[:start].count(b"\n") == first
        assert stop == len(data) or data[stop - 1:stop] == b"\n"
        if nxt:
            assert nxt[0] == stop


def test_tasks_number_records_like_one_pass(tmp_path):
    text = "".join(f'{{"text": "doc {i}"}}\n' if i % 7 else "\n" for i in range(500))
    (tmp_path / "a.jsonl").write_text(text)
    reader = JsonlReader()
    files = discover([str(tmp_path)], suffixes=reader.suffixes)
    whole = [(r, v) for t in reader.plan(files, chunk_bytes=1 << 30) for r, v in reader.read(t)]
    tasks = reader.plan(files, chunk_bytes=300)
    assert len(tasks) > 10
    split = [(r, v) for t in tasks for r, v in reader.read(t)]
    assert split == whole
    assert [r for r, _ in whole] == [i for i in range(500) if i % 7]
