"""No RNTuple field is dropped silently: each top-level field is converted (itself, the leaves of its
collection, or the leaf it projects) or named in the one-line warning and the manifest's
``events.skipped_fields`` (guarantee 1)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from conftest import root_data, run_cli

from shardsmith.core.input_file import InputFile
from shardsmith.sources.root import RootReader
from shardsmith.sources.root.schema import _unaccounted

RUN2012 = "Run2012BC_DoubleMuParked_Muons_1000evts_rntuple_v1-0-0-0.root"


def _top_level(path: Path) -> list[str]:
    import uproot

    records = uproot.open(path)["Events"].field_records
    return [r.field_name for i, r in enumerate(records) if r.parent_field_id == i]


def test_every_field_of_the_real_rntuple_is_read():
    """RNTupleImporter's files hold each collection twice: ``_collection0`` (a collection of records
    ``Muon_pt``, ``Muon_eta``, ...) and the projections ``Muon_pt`` over it; the leaves are read once,
    under the projected names, counted by the cardinality field ``nMuon``. Nothing is left."""
    name = RUN2012  # (the ttbar nanoAOD RNTuple passes too: 947 fields, none skipped; 5 s in uproot's field walk)
    path = root_data() / name
    reader = RootReader()
    schema, skipped = reader.schema([InputFile(path=str(path), rel=name, index=0, size=path.stat().st_size)])
    assert skipped == []
    fields = {f.name for f in schema.fields}
    collections = [n for n in _top_level(path) if n.startswith("_collection")]
    assert collections, "the file has RNTupleImporter's collections"
    for top in _top_level(path):
        assert top in fields or top in collections, top
    assert {f.name: f.counter for f in schema.fields} == {
        "Muon_pt": "nMuon", "Muon_eta": "nMuon", "Muon_phi": "nMuon", "Muon_mass": "nMuon",
        "Muon_charge": "nMuon", "nMuon": None}


def test_the_real_muon_rntuple_converts_without_a_warning(tmp_path):
    out = tmp_path / "out"
    res = run_cli("convert", root_data() / RUN2012, "-o", out, "--to", "hdf5", "--workers", "1")
    assert res.exit_code == 0, res.stderr
    assert "warning" not in res.stderr
    assert json.loads((out / "manifest.json").read_text())["events"]["skipped_fields"] == []


def test_a_nested_collection_is_named_in_one_warning_line(tmp_path):
    import awkward as ak
    import uproot

    path = tmp_path / "nested.root"
    with uproot.recreate(path) as f:
        f.mkrntuple("Events", ak.Array({
            "x": [1.0, 2.0, 3.0],
            "hits": [[[1, 2], [3]], [], [[4]]],  # a collection of collections
            "jets": [[{"pt": 1.0, "eta": 2.0}], [], [{"pt": 3.0, "eta": 1.0}]],  # a collection of records
            "v": [[1.5], [], [2.5, 3.5]],
        }))
    out = tmp_path / "out"
    res = run_cli("convert", path, "-o", out, "--to", "hdf5", "--workers", "1")
    assert res.exit_code == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].endswith(": hits") and "nested collections" in warnings[0], res.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["events"]["skipped_fields"] == ["hits"]
    assert set(m["schema"]) == {"x", "jets_pt", "jets_eta", "v"}


def test_a_top_level_field_nothing_reads_is_named():
    """The last guard: a field that is neither read nor named by the walk (say, a projection of a
    leaf that was skipped) is named too."""
    records = [SimpleNamespace(field_name=n, parent_field_id=i) for i, n in enumerate(["a", "b", "c"])]
    records.append(SimpleNamespace(field_name="_0", parent_field_id=1))  # below b: not top-level
    leaves = [SimpleNamespace(names=("a",))]
    assert _unaccounted(records, leaves, skipped=["c.y"]) == ["b"]
