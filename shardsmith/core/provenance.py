"""Where each event came from (``convert --provenance``): two fixed fields added to every event.

``_file`` (int32) is the event's input file, as an index into the manifest's ``source.inputs``
(the inputs' names relative to the input root, the names the manifest already uses; listed in
full, never cut to a count, when provenance is on); ``_entry`` (int64) is where the event sits in
that file: the TTree or RNTuple entry, the Parquet row, or with ``--group-by`` the first row of
the event's group (the group's key is a field already). They are ordinary fields of the schema,
so they go through the record codec, the shuffle, splits, workers, stages and resume like any
other, every event format writes them, and every loader returns them (``ds[i]["_entry"]``,
``batch.fixed["_file"]``). Without ``--provenance`` nothing changes.

Details: the two fields are added at the end of the schema; ``events.provenance`` says which entry
(``entry_is``, from ``Reader.provenance_entry()``: the record unit unless a source says otherwise).
They are made in the worker (``transforms/event_payload.py`` ``EventProcessor``, after
``--balance``, on the records the source numbered; a source that groups rows gives each event's
first row in ``EventChunk.entries``), so a format added later (a fixed-shape export) gets them as
two per-event scalars of the schema. With ``--group-by`` the first row and the ``n_rows`` count
lead straight back to the hits: ``table.slice(_entry, n_rows)``; ``ds.inputs`` holds the names. An
input field named ``_file`` or ``_entry`` is refused (leave it out with ``--branches``/``--columns``);
``--provenance`` on rows or images is a usage error; without it the schema, the manifest and the
shards are unchanged (``tests/test_golden.py``). ``core/manifest.py`` checks that
``events.provenance`` names two fixed fields of those dtypes and that ``source.inputs`` is a list.
Tested in ``tests/test_provenance.py`` against uproot's and pyarrow's own reading of the inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.core.events import EventChunk, EventSchema, Field
from shardsmith.errors import UsageError

FILE_FIELD = "_file"
ENTRY_FIELD = "_entry"
FIELDS = (Field(name=FILE_FIELD, dtype="<i4"), Field(name=ENTRY_FIELD, dtype="<i8"))
FIELD_DTYPES = {f.name: f.dtype for f in FIELDS}
MAX_FILES = 1 << 31  # the file index is an int32


def with_provenance(schema: EventSchema) -> EventSchema:
    """The schema with the two provenance fields at its end; an input field of either name is refused."""
    clash = [f.name for f in schema.fields if f.name in (FILE_FIELD, ENTRY_FIELD)]
    if clash:
        raise UsageError(f"--provenance adds the fields {FILE_FIELD} and {ENTRY_FIELD}, but the input has a "
                         f"field {clash[0]!r}; leave it out with --branches/--columns")
    return EventSchema((*schema.fields, *FIELDS))


def describe(entry: str) -> dict[str, Any]:
    """The manifest's ``events.provenance``: the two fields, and what an entry counts (``entry``,
    ``row``, ``first row of the event's group``: ``Reader.provenance_entry``)."""
    return {"file": FILE_FIELD, "entry": ENTRY_FIELD, "entry_is": entry}


class Stamp:
    """Adds the provenance columns to a chunk of one input file (in the worker, before encoding)."""

    def __init__(self, *, inputs: list[str]) -> None:
        if len(inputs) >= MAX_FILES:
            raise UsageError(f"--provenance numbers input files with an int32: {len(inputs)} files are too many")
        self.index = {rel: i for i, rel in enumerate(inputs)}

    def __call__(self, chunk: EventChunk, rel: str, records: np.ndarray) -> EventChunk:
        entries = records if chunk.entries is None else chunk.entries
        columns = {**chunk.columns, FILE_FIELD: np.full(chunk.n, self.index[rel], dtype=np.int32),
                   ENTRY_FIELD: np.asarray(entries, dtype=np.int64)}
        return EventChunk(first=chunk.first, n=chunk.n, columns=columns, offsets=chunk.offsets,
                          entries=chunk.entries)


def inputs_of(manifest: dict[str, Any]) -> list[str] | None:
    """The input names ``_file`` indexes, or None for a dataset made without ``--provenance``."""
    events = manifest.get("events")
    if not isinstance(events, dict) or not isinstance(events.get("provenance"), dict):
        return None
    inputs = manifest.get("source", {}).get("inputs")
    return list(inputs) if isinstance(inputs, list) else None


def check_manifest(m: dict[str, Any], bad: Any) -> None:
    """``events.provenance`` names two fields of the schema, and ``source.inputs`` lists every input."""
    events = m.get("events")
    prov = events.get("provenance") if isinstance(events, dict) else None
    if prov is None:
        return
    if not isinstance(prov, dict):
        raise bad("'events.provenance' must be an object")
    for key, want in (("file", FIELD_DTYPES[FILE_FIELD]), ("entry", FIELD_DTYPES[ENTRY_FIELD])):
        name = prov.get(key)
        field = m["schema"].get(name) if isinstance(name, str) else None
        if not isinstance(field, dict) or field.get("dtype") != want or field.get("counter") is not None:
            raise bad(f"'events.provenance.{key}' must name a fixed {want} field of the schema")
    inputs = m.get("source", {}).get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
        raise bad("'source.inputs' must list every input when 'events.provenance' is set")
