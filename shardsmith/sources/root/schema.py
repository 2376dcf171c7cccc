"""Which branches of a TTree or fields of an RNTuple can be read, and as what: ``_Leaf``s with
their ``Field`` (dtype, shape, counter) found by walking awkward forms; the rest is skipped by name.

Fields not converted are named: a branch or RNTuple field that is not a number or a list of numbers
(strings, objects, records, nested collections) is listed in the manifest's
``events.skipped_fields`` and in one warning line on stderr (unless ``-q``). For RNTuples
``_unaccounted`` checks at the end that every top-level field is read (itself, a leaf of its
collection, or the leaf it projects) or named; RNTupleImporter's ``_collection0`` (a collection of
records) is read through its leaves under the projected names (``Muon_pt``, counted by ``nMuon``).
The two real RNTuples in the test data lose nothing: the muon file in
``tests/test_rntuple_fields.py``, the ttbar nanoAOD one (947 fields, as its TTree twin) by hand,
since uproot's field walk takes 5 s on it."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema, Field

_STRINGS = ("string", "bytestring", "char", "byte")
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
    return leaves, skipped + _unaccounted(records, leaves, skipped)


def _unaccounted(records: Any, leaves: list[_Leaf], skipped: list[str]) -> list[str]:
    """Top-level fields neither read (themselves, a leaf below them, or the leaf they project) nor
    already named as skipped: named too, so that no field of an RNTuple is ever dropped silently."""
    tops = {name.split(".", 1)[0] for leaf in leaves for name in leaf.names} | {s.split(".", 1)[0] for s in skipped}
    return [r.field_name for i, r in enumerate(records) if r.parent_field_id == i and r.field_name not in tops]


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
