"""The report of a memmap event dataset: the events of a seeded sample of each split, read through
the loader's ``MemmapDataset`` rows (the fixed-shape arrays), as the events sections
(``kit/sections/event_stats.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema
from shardsmith.formats.memmap.dataset import MemmapDataset
from shardsmith.kit.sections.dataset_sample import events_note, picked, sampled_batches
from shardsmith.kit.sections.event_stats import EventSample, event_sections
from shardsmith.kit.sections.model import Sampling, Section


def memmap_sections(out: Path, manifest: dict[str, Any], sampling: Sampling) -> list[Section]:
    """The values as stored (in the arrays' dtype, truncated to --max-len); the multiplicity is the
    count of values each event had before truncation."""
    chosen = picked(manifest, sampling, cap=sampling.max_samples)
    sample = EventSample(schema=EventSchema.from_json(manifest["schema"]))
    counter = manifest["memmap"]["counter"]
    for ds, batch in sampled_batches(MemmapDataset, out, chosen, sampling):
        kept = np.arange(ds.max_len)[None, :] < batch["lengths"][:, None]  # (B, L): stored, not padding
        columns = {name: batch["values"][..., f][kept] for f, name in enumerate(ds.fields)}
        columns.update(batch["scalars"])
        offsets = np.concatenate([[0], np.cumsum(batch["counts"])])
        sample.add(len(batch["lengths"]), columns, {counter: offsets})
    return event_sections(sample, said=events_note(chosen, sampling, sample.events, "events"),
                          fields=sampling.fields)
