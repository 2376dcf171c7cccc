"""ROOT event files (TTree and RNTuple) through uproot: numeric branches as columnar ``EventChunk``s.

An event is one entry; its identity is (file, entry). Flat scalars and fixed-size arrays become
fixed fields; jagged branches become ragged fields, and branches that share a counter (``NJet``
for ``Jet_Px`` and ``Jet_Py``, or one RNTuple collection) share one offsets array. Values come
out of the awkward layout's buffers (offsets and content) without a copy per event. Tasks are
entry ranges cut at cluster boundaries; each task is read in steps of bounded uncompressed size
so memory stays flat for files larger than RAM.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema, Field
from shardsmith.engine.inputs import InputFile
from shardsmith.errors import DataError, UsageError
from shardsmith.sources.base import Reader, StreamError, Task

_TREE_CLASSES = ("TTree", "ROOT::RNTuple")
_STRINGS = ("string", "bytestring", "char", "byte")
_SHOWN = 8  # names listed in an error message
_CARDINALITY = {"std::uint32_t": "<u4", "std::uint64_t": "<u8"}


@dataclass(frozen=True, slots=True)
class _Leaf:
    """One selected field: how uproot reads it and where it sits in the result."""

    field: Field
    key: str  # the name handed to uproot
    path: tuple[str, ...]  # the top-level name in uproot's result, then record fields below it
    names: tuple[str, ...]  # every name a --branches glob may match (key, its parents, an alias)


class _Skip(Exception):
    """A branch that is not a numeric scalar, fixed-size array or singly jagged list."""


class RootReader(Reader):
    name = "root"
    suffixes = (".root",)
    unit = "entry"
    holds = "events"
    columnar = True

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
        self.tree_name: str | None = tree  # the tree read (the only one of the first file when not given)

    # -- schema ---------------------------------------------------------------------------

    def schema(self, files: list[InputFile]) -> tuple[EventSchema, list[str]]:
        """The fields of the first file, checked against every other file, and the branches skipped."""
        if not files:
            raise ValueError("no files")
        first: EventSchema | None = None
        skipped: list[str] = []
        for f in files:
            leaves, skip = self._leaves(f)
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


_OPEN: dict[str, Any] = {}  # this process's one open file: {"key": ..., "tree": ..., "memo": {...}}


def _open(file: InputFile, tree: str | None) -> tuple[Any, dict[Any, Any]]:
    """The chosen tree of a file and a memo for what is derived from it, kept open in this
    process until another file is asked for: uproot's first look at a wide RNTuple is quadratic
    in its fields (seconds for nanoAOD), so schema, plan and the tasks of one file share it.

    The key holds the process id, so a forked worker never shares its parent's file offset, and
    the size and mtime, so a file replaced in place is opened afresh. A replaced entry is only
    forgotten, not closed: a read still under way keeps its file until it ends.
    File-level problems become one-line ``DataError``s.
    """
    try:
        st = os.stat(file.path)
    except OSError as exc:
        raise DataError(file=file.rel, reason=f"cannot open: {exc.strerror}") from None
    key = (os.getpid(), file.path, st.st_size, st.st_mtime_ns, tree)
    if _OPEN.get("key") == key:
        return _OPEN["tree"], _OPEN["memo"]
    _OPEN.clear()
    handle = _open_file(file)
    try:
        name, obj = _choose_tree(file, handle, tree)
    except BaseException:
        handle.close()
        raise
    _OPEN.update(key=key, tree=obj, memo={"tree_name": name})
    return obj, _OPEN["memo"]


def _fast_inflate() -> None:
    """Inflate ZLIB baskets with ISA-L when python-isal is installed (the ``root`` extra): the
    same bytes, and uproot read the 500k-event bench file in 6.2 s instead of 8.6-10.2 s here.
    uproot offers ISA-L (scikit-hep/uproot5#1090) through ``uproot.ZLIB.library``, but that
    switch reaches only compression; reading goes through the module's one decompressor object,
    so it is set on that object alone (writing, e.g. a user's ``uproot.recreate`` in the same
    process, keeps zlib). When uproot has no such object, reading stays on zlib."""
    try:
        import isal.isal_zlib  # noqa: F401
        from uproot import compression
    except ImportError:
        return
    inflate = getattr(compression, "_decompress_ZLIB", None)
    if getattr(inflate, "library", None) == "zlib":
        inflate.library = "isal"


def _open_file(file: InputFile) -> Any:
    import uproot

    _fast_inflate()
    try:
        return uproot.open(file.path, object_cache=None, array_cache=None)
    except PermissionError as exc:  # not a damaged file: say what is wrong
        raise DataError(file=file.rel, reason=f"cannot open: {exc.strerror}") from None
    except Exception as exc:
        raise DataError(file=file.rel, reason=f"not a readable ROOT file (truncated or corrupt?): "
                        f"{_one_line(exc)}") from None


def _choose_tree(file: InputFile, handle: Any, tree: str | None) -> tuple[str, Any]:
    """``--tree``, or the only TTree/RNTuple of the file; errors list the trees there are."""
    rel = file.rel
    try:
        trees = sorted({k.rsplit(";", 1)[0] for k, c in handle.classnames().items() if c in _TREE_CLASSES})
    except Exception as exc:
        raise DataError(file=rel, reason=f"not a readable ROOT file (truncated or corrupt?): "
                        f"{_one_line(exc)}") from None
    listed = ", ".join(trees) if trees else "none"
    if tree is None:
        if not trees:
            raise DataError(file=rel, reason="no TTree or RNTuple in this file")
        if len(trees) > 1:
            raise UsageError(f"{rel}: {len(trees)} trees in this file ({listed}); choose one with --tree")
        name = trees[0]
    elif tree.rsplit(";", 1)[0] in trees:
        name = tree
    else:
        raise UsageError(f"{rel}: --tree {tree!r}: no such tree in this file (trees: {listed})")
    try:
        obj = handle[name]
        int(obj.num_entries)
    except Exception as exc:
        raise DataError(file=rel, reason=f"cannot read tree {name!r}: {_one_line(exc)}") from None
    return name, obj


# -- finding the numeric branches --------------------------------------------------------------


def _is_rntuple(obj: Any) -> bool:
    return type(obj).__name__.endswith("RNTuple") or hasattr(obj, "field_records")


def _ttree_leaves(tree: Any) -> tuple[list[_Leaf], list[str]]:
    """Every data-holding branch: numeric ones as leaves, the others skipped by name."""
    every = list(tree.iteritems(recursive=True))
    key_of = {id(b): k for k, b in every}  # count branches may be parents (split vector<object>)
    items = [(k, b) for k, b in every if not b.branches]
    leaves: list[_Leaf] = []
    skipped: list[str] = []
    for key, branch in items:
        try:
            form = branch.interpretation.awkward_form(tree.file)
            dtype, shape, lists = _walk_form(form, ())
        except Exception:  # _Skip, or an interpretation uproot cannot express as a form
            skipped.append(key)
            continue
        name = key.replace("/", "_")
        counter = None
        if lists:
            count = branch.count_branch
            counter = name if count is None else key_of.get(id(count), count.name).replace("/", "_")
        parts = key.split("/")
        names = (key, name, *("/".join(parts[:i]) for i in range(1, len(parts))))
        leaves.append(_Leaf(Field(name=name, dtype=dtype, shape=shape, counter=counter), key, (key,), names))
    return leaves, skipped


def _rntuple_leaves(ntuple: Any) -> tuple[list[_Leaf], list[str]]:
    """The leaf fields of an RNTuple. Projected fields (RNTupleImporter's ``Muon_pt`` over
    ``_collection0.Muon_pt``) name the leaf they project instead of being read twice; a
    collection's group is named by its cardinality field (``nMuon``) when there is one."""
    records = ntuple.field_records
    fields = list(ntuple.iteritems(recursive=True))
    form, _ = ntuple.to_akform()  # the whole RNTuple once: a field's own form drops its parent records
    keys = [k for k, _ in fields]
    key_of = {f.field_id: k for k, f in fields}
    id_of = {k: fid for fid, k in key_of.items()}
    parents = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    cardinality = {records[f.field_id].source_field_id: k for k, f in fields
                   if records[f.field_id].type_name.startswith("ROOT::RNTupleCardinality")}
    children: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        if r.parent_field_id != i:
            children.setdefault(r.parent_field_id, []).append(i)
    alias: dict[str, str] = {}  # real leaf key -> the projected name that shows it
    for k, f in fields:
        target = _projected_leaf(records, children, f.field_id, key_of)
        if target is not None:
            alias.setdefault(target, k)
    leaves: list[_Leaf] = []
    skipped: list[str] = []
    for key, f in fields:
        if key in parents:
            continue  # a record or collection: its leaves are listed below it
        rec = records[f.field_id]
        if rec.source_field_id is not None and not rec.type_name.startswith("ROOT::RNTupleCardinality") \
                and _projected_leaf(records, children, f.field_id, key_of) is not None:
            continue  # shown through the leaf it projects
        path = tuple(key.split("."))  # uproot's keys skip anonymous records, as its arrays do
        try:
            dtype, shape, lists = _walk_form(form, path)
        except Exception:
            skipped.append(key)
            continue
        if rec.type_name.startswith("ROOT::RNTupleCardinality") and not lists and not shape:
            # uproot reads a cardinality as int64; keep the declared type (nanoAOD's uint32 counters)
            dtype = _CARDINALITY.get(rec.type_name[len("ROOT::RNTupleCardinality<"):-1], dtype)
        name = alias.get(key, key).replace(".", "_")
        counter = None
        if lists:
            owner = ".".join(path[:lists[0]])
            if owner == ".".join(path):
                counter = name
            else:
                counter = cardinality.get(id_of.get(owner), owner).replace(".", "_")
        parts = key.split(".")
        names = (key, name, alias.get(key, key), *(".".join(parts[:i]) for i in range(1, len(parts))))
        leaves.append(_Leaf(Field(name=name, dtype=dtype, shape=shape, counter=counter), key, tuple(path),
                            names))
    return leaves, skipped


def _projected_leaf(records: Any, children: dict[int, list[int]], field_id: int,
                    key_of: dict[int, str]) -> str | None:
    """The real leaf an RVec projection shows (``Muon_pt`` -> ``_collection0.Muon_pt``), if any."""
    if records[field_id].source_field_id is None:
        return None
    below = children.get(field_id, [])
    if len(below) != 1 or records[below[0]].source_field_id is None:
        return None
    return key_of.get(records[below[0]].source_field_id)


def _walk_form(form: Any, path: tuple[str, ...]) -> tuple[str, tuple[int, ...], list[int]]:
    """(little-endian dtype, inner shape, list dimensions) of the leaf at ``path`` in ``form``.

    Each list dimension is recorded as how many path names were taken when it was met, so the
    caller knows which collection owns it. Raises ``_Skip`` for anything but numbers in at most
    one list dimension.
    """
    import awkward as ak

    lists: list[int] = []
    shape: list[int] = []
    taken = 0
    node = form
    while True:
        if node.parameter("__array__") in _STRINGS:
            raise _Skip("strings")
        if isinstance(node, ak.forms.UnmaskedForm):
            node = node.content
        elif isinstance(node, ak.forms.RecordForm):
            if taken == len(path) or path[taken] not in node.fields:
                raise _Skip("a record")
            node = node.content(path[taken])
            taken += 1
        elif isinstance(node, (ak.forms.ListOffsetForm, ak.forms.ListForm)):
            if shape:
                raise _Skip("a list inside a fixed-size array")
            lists.append(taken)
            node = node.content
        elif isinstance(node, ak.forms.RegularForm):
            shape.append(node.size)
            node = node.content
        elif isinstance(node, ak.forms.NumpyForm):
            if taken != len(path):
                raise _Skip("path ends early")
            dtype = np.dtype(ak.types.numpytype.primitive_to_dtype(node.primitive)).newbyteorder("<")
            if dtype.kind not in "biufc" or dtype.itemsize not in (1, 2, 4, 8):
                raise _Skip(f"dtype {dtype}")
            if len(lists) > 1:
                raise _Skip("nested lists")
            return dtype.str, (*shape, *node.inner_shape), lists
        else:
            raise _Skip(type(node).__name__)


def _matches(glob: str, names: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for name in names)


def _difference(a: EventSchema, b: EventSchema) -> str:
    mine = {f.name: f for f in a.fields}
    theirs = {f.name: f for f in b.fields}
    missing = [n for n in mine if n not in theirs]
    if missing:
        return f"no field {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    extra = [n for n in theirs if n not in mine]
    if extra:
        return f"an extra field {extra[0]!r}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
    for n, f in mine.items():
        g = theirs[n]
        if f != g:
            return (f"field {n!r} is {g.dtype}{list(g.shape) or ''} counted by {g.counter} here, "
                    f"{f.dtype}{list(f.shape) or ''} counted by {f.counter} there")
    return "the fields are in another order"


# -- sizes and cuts -----------------------------------------------------------------------------


def _clusters(obj: Any, leaves: list[_Leaf], memo: dict[Any, Any]) -> tuple[list[int], list[float]]:
    """Entry boundaries where every selected column starts a new basket/cluster, and the
    estimated uncompressed bytes of each range between them (metadata only, no data read)."""
    key = ("clusters", tuple(leaf.key for leaf in leaves))
    if key not in memo:
        memo[key] = _rntuple_clusters(obj, leaves) if _is_rntuple(obj) else _ttree_clusters(obj, leaves)
    return memo[key]


def _ttree_clusters(obj: Any, leaves: list[_Leaf]) -> tuple[list[int], list[float]]:
    entries = int(obj.num_entries)
    common: set[int] | None = None
    total = 0.0
    for key in dict.fromkeys(leaf.key for leaf in leaves):
        branch = obj[key]
        offsets = [int(x) for x in branch.entry_offsets]
        common = set(offsets) if common is None else common & set(offsets)
        total += _branch_bytes(branch)
    bounds = sorted((common or set()) | {0, entries})
    bounds = [b for b in bounds if 0 <= b <= entries]
    per_entry = total / max(1, entries)
    return bounds, [per_entry * (b - a) for a, b in zip(bounds[:-1], bounds[1:])]


def _branch_bytes(branch: Any) -> float:
    """Uncompressed bytes of a branch: ``fTotBytes`` for baskets written out, the used part of
    baskets embedded in the TBranch (their declared size is the buffer capacity, often far more)."""
    embedded = branch.embedded_baskets or []
    used = sum(b.border + 8 * (b.num_entries + 1) for b in embedded)
    return float(branch.member("fTotBytes")) + used


def _rntuple_clusters(ntuple: Any, leaves: list[_Leaf]) -> tuple[list[int], list[float]]:
    records = ntuple.field_records
    wanted: set[int] = set()
    for leaf in leaves:
        fid = ntuple[leaf.key].field_id
        while fid not in wanted:  # the leaf and every field above it (collections hold the offsets)
            wanted.add(fid)
            fid = records[fid].parent_field_id
    columns = [(i, c.nbits) for i, c in enumerate(ntuple.column_records) if c.field_id in wanted]
    summaries = ntuple.cluster_summaries
    bounds = [int(summaries[0].num_first_entry)] if summaries else [0]
    sizes: list[float] = []
    pages = ntuple.page_link_list
    for i, s in enumerate(summaries):
        bounds.append(int(s.num_first_entry) + int(s.num_entries))
        nbytes = 0.0
        if i < len(pages):
            for col, nbits in columns:
                if col < len(pages[i]):
                    nbytes += sum(p.num_elements for p in pages[i][col].pages) * nbits / 8
        sizes.append(nbytes)
    return bounds, sizes


def _cut(bounds: list[int], sizes: list[float], chunk_bytes: int) -> list[tuple[int, int]]:
    """Entry ranges of about ``chunk_bytes``: whole clusters, joined while they fit.

    A cluster is never split between tasks: every task that touched it would decompress all of
    its baskets (measured: 4x the decompression of uproot's own iterate on 10k-entry baskets).
    A task's memory stays bounded anyway: it is read in steps of ``step_bytes``.
    """
    ranges: list[tuple[int, int]] = []
    start, acc = bounds[0], 0.0
    for a, _b, size in zip(bounds[:-1], bounds[1:], sizes):
        if acc and acc + size > chunk_bytes:
            ranges.append((start, a))
            start, acc = a, 0.0
        acc += size
    if start < bounds[-1]:
        ranges.append((start, bounds[-1]))
    return ranges or [(bounds[0], bounds[-1])]


def _cluster_steps(bounds: list[int], start: int, stop: int, step: int) -> Iterator[tuple[int, int]]:
    """Read ranges for an RNTuple: whole clusters (uproot decompresses a cluster per call, so a
    cluster is never read twice), joined while they fit in one step."""
    edges = sorted({start, stop, *(b for b in bounds if start < b < stop)})
    a = edges[0]
    for lo, hi in zip(edges[:-1], edges[1:]):
        if lo > a and hi - a > step:
            yield a, lo
            a = lo
    yield a, stop


class _NextCluster(MutableMapping):
    """An array cache for uproot's RNTuple reads that keeps what the next read will ask for.

    uproot 5.7 also decodes the cluster after a range that ends on a cluster boundary (it looks
    the stop up with ``side="right"``), column by column: cluster k, then k + 1. Keeping the
    columns of the newest two clusters and handing each out once (a hit is removed) saves the
    second decoding of every cluster, holding about one cluster of copies between reads.
    Keys are ``"{ntuple}:{cluster}:{column}"``.
    """

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self._newest = -1

    def __getitem__(self, key: str) -> Any:
        return self._data.pop(key)

    def __setitem__(self, key: str, value: Any) -> None:
        try:
            cluster = int(key.rsplit(":", 2)[1])
        except (IndexError, ValueError):
            return  # an unknown key format: cache nothing
        if cluster > self._newest:
            self._newest = cluster
            for old in [k for k in self._data if int(k.rsplit(":", 2)[1]) < cluster - 1]:
                del self._data[old]
        if cluster >= self._newest - 1:
            self._data[key] = value

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


# -- arrays to chunks -------------------------------------------------------------------------


def _to_chunk(arrays: dict[str, Any], leaves: list[_Leaf], *, first: int, file: str) -> EventChunk:
    """Columns and shared offsets from uproot's awkward arrays, through the layouts' buffers."""
    import awkward as ak

    columns: dict[str, np.ndarray] = {}
    offsets: dict[str, np.ndarray] = {}
    owner: dict[str, str] = {}
    n = -1
    for leaf in leaves:
        f = leaf.field
        layout = ak.to_layout(arrays[leaf.path[0]])
        n = len(layout) if n < 0 else n
        try:
            values, off = _extract(layout, leaf.path[1:])
        except _Repack:  # ListArray with gaps, IndexedArray: one packed copy, then the same walk
            values, off = _extract(ak.to_layout(ak.to_packed(arrays[leaf.path[0]])), leaf.path[1:])
        if f.counter is None:
            columns[f.name] = _as(values, f)
            continue
        assert off is not None
        if f.counter in offsets:
            if not np.array_equal(offsets[f.counter], off):
                bad = int(np.flatnonzero(offsets[f.counter] != off)[0]) - 1
                raise DataError(file=file, record=first + max(bad, 0), unit="entry",
                                reason=f"{leaf.key!r} and {owner[f.counter]!r} share the counter {f.counter!r} "
                                       f"but their lengths differ")
        else:
            offsets[f.counter] = off
            owner[f.counter] = leaf.key
        columns[f.name] = _as(values, f)
    return EventChunk(first=first, n=max(n, 0), columns=columns, offsets=offsets)


class _Repack(Exception):
    """A layout that is not plain buffers (indexed, or lists out of order): pack it first."""


def _extract(layout: Any, fields: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    """The leaf's values (rows, *shape) and, if it is jagged, its offsets starting at 0.

    Views of uproot's buffers: offsets are sliced (and shifted to start at 0), the content is
    sliced to the rows they cover. Raises ``_Repack`` for layouts that need packing first.
    """
    import awkward as ak

    node = layout
    lo, hi = 0, len(layout)  # rows of ``node`` that belong to this chunk
    off: np.ndarray | None = None
    i = 0
    while True:
        if isinstance(node, ak.contents.UnmaskedArray):
            node = node.content
        elif isinstance(node, ak.contents.RecordArray):
            node = node.content(fields[i])
            i += 1
        elif isinstance(node, ak.contents.ListOffsetArray):
            raw = np.asarray(node.offsets)[lo:hi + 1].astype(np.int64, copy=False)
            lo, hi = int(raw[0]), int(raw[-1])
            off = raw - lo if lo else raw
            node = node.content
        elif isinstance(node, ak.contents.ListArray):
            starts = np.asarray(node.starts)[lo:hi].astype(np.int64, copy=False)
            stops = np.asarray(node.stops)[lo:hi].astype(np.int64, copy=False)
            if len(starts) and not np.array_equal(starts[1:], stops[:-1]):
                raise _Repack  # lists out of order or with gaps
            lo, hi = (int(starts[0]), int(stops[-1])) if len(starts) else (0, 0)
            off = np.concatenate([[lo], stops]) - lo
            node = node.content
        elif isinstance(node, (ak.contents.RegularArray, ak.contents.NumpyArray)):
            return _rows(node, lo, hi), off
        else:
            raise _Repack


def _rows(node: Any, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of a NumpyArray, or of a RegularArray of them, as one numpy view."""
    import awkward as ak

    if isinstance(node, ak.contents.NumpyArray):
        return np.asarray(node.data)[lo:hi]
    size = node.size
    inner = _rows(node.content, lo * size, hi * size)
    return inner.reshape(hi - lo, size, *inner.shape[1:])


def _as(values: np.ndarray, f: Field) -> np.ndarray:
    """Little-endian values of the schema's dtype (ROOT stores big-endian)."""
    want = f.np_dtype
    return values if values.dtype == want else values.astype(want)


def _split(chunk: EventChunk, step: int, leaves: list[_Leaf]) -> Iterator[EventChunk]:
    """A chunk cut into pieces of at most ``step`` events (views, no copies)."""
    if chunk.n <= step:
        if chunk.n:
            yield chunk
        return
    for a in range(0, chunk.n, step):
        b = min(a + step, chunk.n)
        columns: dict[str, np.ndarray] = {}
        offsets: dict[str, np.ndarray] = {}
        for c, off in chunk.offsets.items():
            offsets[c] = off[a:b + 1] - off[a]
        for leaf in leaves:
            f = leaf.field
            col = chunk.columns[f.name]
            if f.counter is None:
                columns[f.name] = col[a:b]
            else:
                off = chunk.offsets[f.counter]
                columns[f.name] = col[off[a]:off[b]]
        yield EventChunk(first=chunk.first + a, n=b - a, columns=columns, offsets=offsets)


def _one_line(exc: BaseException) -> str:
    """uproot's multi-line messages as one line, without the file path (the caller names the file)."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    kept = [ln for ln in lines if ln and not ln.startswith(("in file", "for file path", "in object"))]
    text = " ".join(kept) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
