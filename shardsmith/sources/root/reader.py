"""``RootReader``: the schema of a set of ROOT files, tasks cut at cluster boundaries, and each
task read in steps of bounded uncompressed size."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any

from shardsmith.core.events import EventChunk, EventSchema
from shardsmith.core.input_file import InputFile
from shardsmith.errors import DataError, UsageError
from shardsmith.kit.reader import Reader, StreamError, Task
from shardsmith.sources.root.chunks import _split, _to_chunk
from shardsmith.sources.root.clusters import _cluster_steps, _clusters, _cut, _NextCluster
from shardsmith.sources.root.files import URL_SOURCES, _one_line, _open
from shardsmith.sources.root.schema import (
    _difference,
    _is_rntuple,
    _Leaf,
    _matches,
    _rntuple_leaves,
    _ttree_leaves,
)

_SHOWN = 8  # names listed in an error message


class RootReader(Reader):
    name = "root"
    suffixes = (".root",)
    unit = "entry"
    holds = "events"
    columnar = True
    opens_urls = URL_SOURCES  # root:// files read in place, by uproot (only the baskets read)

    @classmethod
    def from_options(cls, opts: Any) -> RootReader:
        if opts.group_by or opts.events_table:
            raise UsageError("--group-by and --events-table apply to Parquet events, not ROOT files")
        return cls(tree=opts.tree, branches=list(opts.branches) if opts.branches else None,
                   step_bytes=opts.step_size)

    def source_fields(self, opts: Any) -> dict[str, Any]:
        return {"tree": self.tree_name or opts.tree}

    def __init__(self, *, tree: str | None = None, branches: list[str] | None = None,
                 step_bytes: int = 64 << 20) -> None:
        if step_bytes <= 0:
            raise ValueError("step_bytes must be positive")
        self.tree = tree
        self.branches = list(branches) if branches else None
        self.step_bytes = step_bytes
        self._schema: EventSchema | None = None
        self._decoded: int | None = None  # the selected columns' bytes decoded, from the files' metadata
        self.tree_name: str | None = tree  # the tree read (the only one of the first file when not given)

    # -- schema ---------------------------------------------------------------------------

    def schema(self, files: list[InputFile]) -> tuple[EventSchema, list[str]]:
        """The fields of the first file, checked against every other file, and the branches skipped."""
        if not files:
            raise ValueError("no files")
        first: EventSchema | None = None
        skipped: list[str] = []
        self._decoded = 0
        for f in files:
            leaves, skip = self._leaves(f)
            self._decoded = None if self._decoded is None else self._add_decoded(f, leaves)
            schema = EventSchema(tuple(leaf.field for leaf in leaves))
            if first is None:
                first, skipped = schema, skip
                self.tree_name = _open(f, self.tree)[1]["tree_name"]
            elif schema != first:
                raise DataError(file=f.rel, reason=f"its fields differ from {files[0].rel}: "
                                f"{_difference(first, schema)}")
        assert first is not None
        self._schema = first
        return first, skipped

    def schema_memo(self) -> dict[str, Any] | None:
        return {"tree_name": self.tree_name, "decoded": self._decoded}

    def recall_schema(self, schema: EventSchema, memo: dict[str, Any]) -> None:
        self._schema, self.tree_name, self._decoded = schema, memo["tree_name"], memo.get("decoded")

    def decoded_bytes(self) -> int | None:
        return self._decoded

    def _add_decoded(self, file: InputFile, leaves: list[_Leaf]) -> int | None:
        """The decoded bytes so far plus this file's selected columns' (its cluster layout, which
        the plan reads next: metadata only); None when a file's layout cannot be read."""
        obj, memo = _open(file, self.tree)
        try:
            return int(self._decoded or 0) + int(sum(_clusters(obj, leaves, memo)[1]))
        except Exception:  # a broken basket index: the plan says so; the buckets go by the input's size
            return None

    def _leaves(self, file: InputFile) -> tuple[list[_Leaf], list[str]]:
        """The selected leaves of a file and the names skipped (memoized while the file is open)."""
        obj, memo = _open(file, self.tree)
        key = ("leaves", tuple(self.branches) if self.branches is not None else None)
        if key not in memo:
            memo[key] = self._select(file, obj)
        return memo[key]

    def _select(self, file: InputFile, obj: Any) -> tuple[list[_Leaf], list[str]]:
        leaves, skipped = (_rntuple_leaves(obj) if _is_rntuple(obj) else _ttree_leaves(obj))
        if self.branches is not None:
            for glob in self.branches:
                if not any(_matches(glob, leaf.names) for leaf in leaves) and \
                        not any(fnmatch.fnmatchcase(name, glob) for name in skipped):
                    available = ", ".join(leaf.field.name for leaf in leaves[:_SHOWN])
                    more = f", … ({len(leaves)} in all)" if len(leaves) > _SHOWN else ""
                    raise UsageError(f"{file.rel}: --branches {glob!r} matches no branch "
                                     f"(branches: {available}{more})")
            leaves = [leaf for leaf in leaves if any(_matches(g, leaf.names) for g in self.branches)]
            skipped = [name for name in skipped if any(fnmatch.fnmatchcase(name, g) for g in self.branches)]
        if not leaves:
            raise DataError(file=file.rel, reason="no numeric branches to read"
                            + (f" (skipped: {', '.join(skipped[:_SHOWN])})" if skipped else ""))
        seen: dict[str, str] = {}
        for leaf in leaves:
            other = seen.setdefault(leaf.field.name, leaf.key)
            if other != leaf.key:
                raise DataError(file=file.rel, reason=f"branches {other!r} and {leaf.key!r} both become field "
                                f"{leaf.field.name!r}; leave one out with --branches")
        return leaves, skipped

    def _file_leaves(self, file: InputFile) -> list[_Leaf]:
        """The leaves of one file, which must match the schema the dataset was planned with."""
        leaves, _ = self._leaves(file)
        if self._schema is not None:
            schema = EventSchema(tuple(leaf.field for leaf in leaves))
            if schema != self._schema:
                raise DataError(file=file.rel, reason=f"its fields differ from the first file's: "
                                f"{_difference(self._schema, schema)}")
        return leaves

    # -- plan -----------------------------------------------------------------------------

    def plan_file(self, file: InputFile, *, chunk_bytes: int) -> list[tuple[int, int, int]]:
        leaves = self._file_leaves(file)
        obj, memo = _open(file, self.tree)
        if int(obj.num_entries) == 0:
            return [(0, 0, 0)]
        try:
            clusters, sizes = _clusters(obj, leaves, memo)
        except Exception as exc:  # a broken basket index or page list
            raise DataError(file=file.rel, reason=f"cannot read the cluster layout: {_one_line(exc)}") from None
        return [(a, b, a) for a, b in _cut(clusters, sizes, chunk_bytes)]

    # -- read -----------------------------------------------------------------------------

    def read(self, task: Task) -> Iterator[EventChunk | StreamError]:  # type: ignore[override]
        leaves = self._file_leaves(task.file)
        obj, memo = _open(task.file, self.tree)
        stop = int(obj.num_entries) if task.stop < 0 else task.stop
        if stop <= task.start:
            return
        try:
            clusters, sizes = _clusters(obj, leaves, memo)
        except Exception as exc:
            yield StreamError(f"cannot read the cluster layout: {_one_line(exc)}")
            return
        per_entry = max(1.0, sum(sizes) / max(1, clusters[-1] - clusters[0]))
        step = max(1, int(self.step_bytes // per_entry))
        keys = list(dict.fromkeys(leaf.key for leaf in leaves))
        if _is_rntuple(obj):
            ranges = _cluster_steps(clusters, task.start, stop, step)
            cache = _NextCluster()
            batches = (obj.arrays(keys, entry_start=a, entry_stop=b, how=dict, array_cache=cache) for a, b in ranges)
        else:
            batches = obj.iterate(keys, entry_start=task.start, entry_stop=stop, step_size=step,
                                  how=dict, library="ak")
        pos = task.start
        while pos < stop:
            try:
                arrays = next(batches)
            except StopIteration:
                break
            except Exception as exc:  # uproot raises zlib/OSError/ValueError/Deserialization errors
                yield StreamError(f"cannot read at entry {pos + 1}: {_one_line(exc)}")
                return
            chunk = _to_chunk(arrays, leaves, first=pos, file=task.file.rel)
            del arrays
            yield from _split(chunk, step, leaves)
            pos += chunk.n
