"""The report of an event-tar dataset: the events of a seeded sample of each split, read through
the loader's ``EventTarDataset`` samples, as the events sections (``kit/sections/event_stats.py``),
then the tar members' section that ``webdataset`` datasets have (its ``report.tar_sections``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.core.events import EventSchema
from shardsmith.formats.event_tar.dataset import EventTarDataset
from shardsmith.formats.webdataset.report import tar_sections
from shardsmith.kit.sections.dataset_sample import events_note, picked
from shardsmith.kit.sections.event_stats import EventSample, event_sections
from shardsmith.kit.sections.model import Sampling, Section


def event_tar_sections(out: Path, manifest: dict[str, Any], sampling: Sampling) -> list[Section]:
    chosen = picked(manifest, sampling, cap=sampling.max_samples)
    sample = EventSample(schema=EventSchema.from_json(manifest["schema"]))
    for split, (_, idx) in chosen.items():
        ds = EventTarDataset(out, split=split)
        for i in idx.tolist():
            if sampling.late():
                break
            sample.add_sample(ds[i], per_sample=ds.events_per_sample)
        ds.release()
    said = events_note(chosen, sampling, sample.events, "samples")
    return event_sections(sample, said=said, fields=sampling.fields) + tar_sections(out, manifest, sampling, images=False)
