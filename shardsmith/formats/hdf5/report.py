"""The report of an HDF5 event dataset: the events of a seeded sample of each split, read through
the loader's ``EventDataset`` batches, as the events sections (``kit/sections/event_stats.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.core.events import EventSchema
from shardsmith.formats.hdf5.dataset import EventDataset
from shardsmith.kit.sections.dataset_sample import events_note, picked, sampled_batches
from shardsmith.kit.sections.event_stats import EventSample, event_sections
from shardsmith.kit.sections.model import Sampling, Section


def hdf5_sections(out: Path, manifest: dict[str, Any], sampling: Sampling) -> list[Section]:
    chosen = picked(manifest, sampling, cap=sampling.max_samples)
    sample = EventSample(schema=EventSchema.from_json(manifest["schema"]))
    for _, batch in sampled_batches(EventDataset, out, chosen, sampling):
        columns = {**batch.fixed, **{name: r.values for name, r in batch.ragged.items()}}
        sample.add(batch.n, columns, {c: batch.offsets(c) for c in sample.schema.counters})
    return event_sections(sample, said=events_note(chosen, sampling, sample.events, "events"),
                          fields=sampling.fields)
