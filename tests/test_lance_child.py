"""The process that writes a Lance writer's data files (``formats/lance/child.py``), as the writer
talks to it (``formats/lance/writer.py``): the rows go through a FIFO as pylance reads them, so
every way it can stop reading (pylance refuses the rows, the process ends, the writer's own rows
stop coming) is one line or the writer's own error, never a hang, and the next shard still gets
written."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lance", reason="--to lance needs pylance")
pa = pytest.importorskip("pyarrow")

from shardsmith.errors import ShardsmithError  # noqa: E402
from shardsmith.formats.lance.writer import LanceShardWriter, _Child  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:lance is not fork-safe")

ROWS = 200_000  # an int64 column of 1.6 MB: more than a pipe's buffer, so that a refusing child breaks the pipe


def within(seconds: float, fn: Any) -> Any:
    """``fn()``'s result or exception, or a failure if it has not returned in ``seconds`` (a hang)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def fifo(tmp_path: Path, name: str = "rows.arrow") -> str:
    path = str(tmp_path / name)
    os.mkfifo(path)
    return path


def ints(n: int = ROWS) -> Any:
    return pa.table({"id": pa.array(range(n), pa.int64())})


def test_rows_pylance_refuses_are_one_line_and_the_same_child_writes_the_next(tmp_path):
    child = _Child()
    try:
        refused = pa.table({"t": pa.array([pa.MonthDayNano([1, 2, 3])] * ROWS, pa.month_day_nano_interval())})
        request = {"arrow": fifo(tmp_path, "a"), "into": str(tmp_path / "a.tmp"), "version": "2.1"}
        with pytest.raises(ShardsmithError, match=r"pylance could not write shard s0: .*Interval"):
            within(120, lambda: child.stream(request, refused.schema, iter(refused.to_batches()), "s0"))
        good = ints()
        request = {"arrow": fifo(tmp_path, "b"), "into": str(tmp_path / "b.tmp"), "version": "2.1"}
        answer = within(120, lambda: child.stream(request, good.schema, iter(good.to_batches()), "s1"))
        assert (tmp_path / "b.tmp" / "data" / answer["path"]).is_file() and answer["fields"] == [0]
    finally:
        child.close()


def test_a_child_that_ended_is_one_line_not_a_hang(tmp_path):
    child = _Child()
    child.proc.kill()
    child.proc.wait()
    table = ints(10)
    request = {"arrow": fifo(tmp_path), "into": str(tmp_path / "x.tmp"), "version": "2.1"}
    with pytest.raises(ShardsmithError, match=r"the process writing shard s0 with pylance ended \(exit -9\)"):
        within(60, lambda: child.stream(request, table.schema, iter(table.to_batches()), "s0"))
    child.close()


def test_a_child_that_answers_before_it_reads_is_not_waited_for(tmp_path):
    """The FIFO is opened for writing only once the child reads it: a child that answers first
    (here a request it cannot read: no FIFO named) is heard, not waited for."""
    child = _Child()
    try:
        child._send({"into": str(tmp_path / "x.tmp")}, "s0")
        assert within(60, lambda: child._open_writing(fifo(tmp_path))) is None
        with pytest.raises(ShardsmithError, match="pylance could not write shard s0: 'arrow'"):
            child._answer("s0")
    finally:
        child.close()


def test_rows_that_stop_coming_end_the_child_and_the_next_shard_gets_a_new_one(tmp_path):
    """An error in the writer's own rows (raised while they stream) is the writer's error; the child,
    inside a stream cut short, is not asked again: ended, nothing of the shard left in the folder."""
    writer = LanceShardWriter(out_dir=tmp_path, split="train", shard_samples=None, shard_bytes=None)
    table = ints()

    def broken() -> Any:
        yield from table.to_batches()[:2]
        raise ShardsmithError("the rows stop here")

    first = writer._child()
    with pytest.raises(ShardsmithError, match="the rows stop here"):
        within(120, lambda: writer._write_file("train-000000.lance", table.schema, broken(), ROWS))
    assert writer._lance is None and first.proc.poll() is not None
    assert sorted(os.listdir(writer.root)) == []
    record = within(120, lambda: writer._write_file("train-000000.lance", table.schema, iter(table.to_batches()),
                                                    ROWS))
    assert record.samples == ROWS and (writer.root / "data" / "train-000000.lance").is_file()
    writer.close()
