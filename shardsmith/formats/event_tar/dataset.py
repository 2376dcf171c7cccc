"""Events in tar shards, read back as dicts of numpy arrays (``field`` instead of member ``field.npy``).

A subclass of ``TarDataset``: the same random access, shuffled iteration, rank split and
resume; ``.npy`` members are loaded without pickles. With ``events_per_sample`` N a sample is a
window of N events, and ``{counter}.offsets`` cut its ragged fields into events.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema
from shardsmith.core.provenance import inputs_of
from shardsmith.errors import DatasetError
from shardsmith.formats.webdataset.dataset import TarDataset, load_npy
from shardsmith.kit.sample_kind import ListForm, SampleKind


class EventTarDataset(TarDataset):
    """One split of events in tar shards: ``len`` (samples), ``ds[i] -> {field: array}``; ``get_batch``
    and ``iter`` (exact permutation, rank split, resume) come from ``TarDataset`` and the loader's
    pipeline."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train",
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None) -> None:
        super().__init__(out_dir, split=split, cache_dir=cache_dir, cache_limit=cache_limit)
        events = self.manifest.get("events")
        if not isinstance(events, dict):
            raise DatasetError(f"{out_dir}: the manifest describes no events")
        try:
            self.schema = EventSchema.from_json(self.manifest["schema"])
            self.events_per_sample = int(events.get("events_per_sample", 1))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DatasetError(f"{out_dir}: the manifest's event schema is malformed ({exc})") from None
        self._members = {f"{f.name}.npy": f.name for f in self.schema.fields}
        # with --provenance: the input names the ``_file`` field indexes (``_entry``: where in that file)
        self.inputs: list[str] | None = inputs_of(self.manifest)
        if self.events_per_sample > 1:
            self._members.update({f"{c}.offsets.npy": f"{c}.offsets" for c in self.schema.counters})

    @property
    def kind(self) -> SampleKind:
        return SampleKind("event tar samples", ListForm(), (("schema", json.dumps(self.schema.to_json(), sort_keys=True)),
                                                            ("events_per_sample", self.events_per_sample)))

    def __getitem__(self, i: int) -> dict[str, Any]:
        raw = super().__getitem__(i)
        out: dict[str, Any] = {"__key__": raw["__key__"]}
        for member, name in self._members.items():
            value = raw.get(member)
            if not isinstance(value, np.ndarray):
                raise DatasetError(f"{self.out_dir}: sample {raw['__key__']} has no array member {member}")
            out[name] = value
        return out

    def labels(self, field: str = "label") -> np.ndarray:  # type: ignore[override]
        """Every sample's integer label from the fixed scalar event field ``field`` (one event per
        sample), reading only that member of each sample."""
        spec = next((f for f in self.schema.fields if f.name == field), None)
        if spec is None or spec.ragged or spec.shape or spec.np_dtype.kind not in "iu" or self.events_per_sample != 1:
            raise DatasetError(f"{self.out_dir}: labels need a fixed integer scalar field and one event per "
                               f"sample; {field!r} is not one here")
        raw = self.member_bytes(f"{field}.npy")
        if any(b is None for b in raw):
            raise DatasetError(f"{self.out_dir}: a sample has no {field}.npy member")
        where = f"{self.out_dir}: {field}.npy"
        return np.array([load_npy(b, where=where).reshape(-1)[0] for b in raw], np.int64)  # type: ignore[arg-type]
