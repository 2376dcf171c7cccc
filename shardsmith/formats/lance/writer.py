"""Lance data files, one per shard: ``{split}.lance/data/{split}-{000000}.lance``, written by pylance's
own fragment writer with fixed settings, so that the same samples give the same bytes.

A shard's rows are typed as the parquet format types them (``formats/arrow_rows/``: groups
of the workers' samples held lz4-compressed, one schema per shard), then written as an Arrow IPC
stream, through a FIFO, to a process of the writer's own (``child.py``: pylance is not fork-safe,
the workers are forked; started with the writer's first samples, so that pylance loads while the
first shard's rows are typed), which hands it to ``lance.fragment.write_fragments`` as it comes
(the rows are decoded here while pylance encodes them there), into a temporary dataset folder
(pylance names its file with a random UUID); the file, whose bytes depend on the rows alone, is
renamed into place under a name of ours, and its columns, by their paths, kept in the shard's
record for the split's table (``table.py``) once every shard is written. Settings
(``FILE_VERSION``): Lance file format 2.1, and the compression of text and bytes named
(``schema.pinned``: pylance's own choice for text, FSST, trains on a random sample). Shards are
cut by the samples' encoded sizes (``kit/rollover.py``): the same files for any ``--workers``,
``--memory`` or ranks."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardsmith.errors import ShardsmithError
from shardsmith.formats.arrow_rows.grouped import GroupedRowsWriter
from shardsmith.formats.lance.names import FILE_VERSION, SUFFIX, dataset_dir, hashed
from shardsmith.kit.writer import ShardRange, ShardRecord

GROUP_ROWS = 100_000  # rows typed at once (a group's values are held decoded while they are)
GROUP_BYTES = 32 << 20


class LanceShardWriter(GroupedRowsWriter):
    """Rolls over by ``shard_samples``/``shard_bytes``; each shard one Lance data file (one fragment)."""

    name = "lance"
    suffix = SUFFIX

    def __init__(self, *, out_dir: Path, split: str, shard_samples: int | None, shard_bytes: int | None,
                 part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, shard_samples=shard_samples, shard_bytes=shard_bytes,
                         group_rows=GROUP_ROWS, group_bytes=GROUP_BYTES, part=part)
        self.root = self.out_dir / dataset_dir(split)
        self._lance: _Child | None = None  # the process that writes the data files (``child.py``)

    def preload(self) -> None:
        import pyarrow.ipc  # noqa: F401 (imported once, in the parent; pylance in the writers' own processes)

    def write_batch(self, lengths: Any, payload: memoryview) -> None:
        """The writer's pylance process is started with its first samples, not its first shard: its
        interpreter and pylance (~0.4 s) load while the shard's rows are typed (``child.py``)."""
        self._child()
        super().write_batch(lengths, payload)

    def write_shard(self, name: str, schema: Any, tables: Iterator[Any], rows: int) -> ShardRecord:
        import pyarrow as pa

        from shardsmith.formats.lance.schema import pinned

        fixed = pinned(schema)  # the compression of text and bytes named (``schema.COMPRESSION``)
        batches = (pa.RecordBatch.from_arrays(batch.columns, schema=fixed) for table in tables
                   for batch in table.to_batches())
        return self._write_file(name, fixed, batches, rows)

    def _write_file(self, name: str, schema: Any, batches: Any, rows: int) -> ShardRecord:
        """The shard's rows as one Lance data file, renamed into place; its record. pylance writes
        it in this writer's own process (``child.py``: it is not fork-safe), reading the rows as an
        Arrow IPC stream through a pipe while they are decoded here (no copy of the shard on disk)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with tempfile.TemporaryDirectory(prefix="shardsmith-lance-") as pipes:
                fifo = os.path.join(pipes, "rows.arrow")
                os.mkfifo(fifo)
                request = {"arrow": fifo, "into": str(tmp), "version": FILE_VERSION}
                try:
                    data = self._child().stream(request, schema, batches, name)
                except BaseException:  # the child may be inside a stream cut short: it is not asked again
                    self._end_child(kill=True)
                    raise
            (self.root / "data").mkdir(exist_ok=True)
            target = self.root / "data" / name
            os.replace(tmp / "data" / data["path"], target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        size, sha = hashed(target)
        return ShardRecord(path=f"{dataset_dir(self.split)}/data/{name}", samples=rows, bytes=size,
                           sha256=sha, extra={"columns": _column_paths(schema, data, name),
                                              "file_version": f"{data['major']}.{data['minor']}"})

    def _child(self) -> _Child:
        if self._lance is None:
            self._lance = _Child()
        return self._lance

    def _end_child(self, *, kill: bool = False) -> None:
        if self._lance is not None:
            self._lance.close(kill=kill)
            self._lance = None

    def finish_split(self, pieces: list[dict[str, Any]]) -> dict[str, Any]:
        """The split's Lance table over every shard, in order (``table.py``); its files' records."""
        from shardsmith.formats.lance.table import commit_table

        shards = [s for p in pieces for s in p["shards"]]
        return {"flat": {"dataset": dataset_dir(self.split),
                         "files": commit_table(self.out_dir, self.split, shards)}}

    def close(self) -> list[ShardRecord]:
        try:
            return super().close()
        finally:
            self._end_child()

    def abort(self) -> None:
        super().abort()
        self._end_child()


def _column_paths(schema: Any, data: Any, name: str) -> list[list[str]]:
    """The file's columns by their paths, in the file's order (``schema.py``): the ids pylance gave
    them, in the shard's own schema, checked against Lance's numbering as ``schema.leaf_ids`` knows it."""
    from shardsmith.formats.lance.schema import leaf_ids

    ids = leaf_ids(schema)
    by_id = {v: k for k, v in ids.items()}
    if sorted(data["fields"]) != sorted(ids.values()) or data["columns"] != list(range(len(ids))):
        raise RuntimeError(f"pylance numbered the columns of shard {name} unlike Lance's schema numbering "
                           f"({data['fields']}, {data['columns']})")
    return [list(by_id[f]) for f in data["fields"]]


class _Child:
    """A fresh interpreter that writes data files with pylance (``child.py``), asked one shard at a time."""

    def __init__(self) -> None:
        env = {**os.environ, "LANCE_LOG": os.environ.get("LANCE_LOG", "error")}
        self.proc = subprocess.Popen([sys.executable, "-m", "shardsmith.formats.lance.child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)

    def stream(self, request: dict[str, Any], schema: Any, batches: Any, name: str) -> dict[str, Any]:
        """Ask for a data file of ``batches``, written as an Arrow IPC stream into the FIFO
        ``request["arrow"]`` as the child reads it; its answer. A child that stops reading (an error,
        or it ended) breaks the pipe, and one that answers before it reads is not written to: its
        answer, or its end, says why."""
        import pyarrow as pa

        self._send(request, name)
        fd = self._open_writing(request["arrow"])
        if fd is not None:
            try:
                with open(fd, "wb") as sink, pa.ipc.new_stream(sink, schema) as out:
                    for batch in batches:
                        out.write_batch(batch)
            except BrokenPipeError:
                pass
        return self._answer(name)

    def _send(self, request: dict[str, Any], name: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            raise self._ended(name) from None

    def _open_writing(self, fifo: str) -> int | None:
        """The FIFO's writing end, once the child has opened it for reading (a non-blocking open fails
        until then); None if the child answers, or ends, first (its stdout is readable then)."""
        assert self.proc.stdout is not None
        while True:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                if select.select([self.proc.stdout], [], [], 0.005)[0]:
                    return None
                continue
            os.set_blocking(fd, True)
            return fd

    def _answer(self, name: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = self.proc.stdout.readline()
        except OSError:
            line = b""
        if not line:
            raise self._ended(name)
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ShardsmithError(f"--to lance: pylance could not write shard {name}: {answer['error']}")
        return answer

    def _ended(self, name: str) -> ShardsmithError:
        return ShardsmithError(f"--to lance: the process writing shard {name} with pylance ended "
                               f"(exit {self.proc.poll()})")

    def close(self, *, kill: bool = False) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
