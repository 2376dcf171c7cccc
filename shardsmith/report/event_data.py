"""The events that the report of an event dataset reads: a seeded sample of each split, through
the loader's datasets (``EventDataset`` batches for HDF5, ``EventTarDataset`` samples for tar,
``MemmapDataset`` rows for the fixed-shape arrays)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema
from shardsmith.formats.event_tar.dataset import EventTarDataset
from shardsmith.formats.hdf5.dataset import EventDataset
from shardsmith.formats.memmap.dataset import MemmapDataset
from shardsmith.kit.sections.event_stats import EventSample, event_sections
from shardsmith.kit.sections.model import Sampling, Section
from shardsmith.report.tar import picked, sampled_note, tar_sections

BLOCK = 4096  # events a batch reads


def hdf5_sections(out: Path, manifest: dict[str, Any], sampling: Sampling) -> list[Section]:
    chosen = picked(manifest, sampling, cap=sampling.max_samples)
    sample = EventSample(schema=EventSchema.from_json(manifest["schema"]))
    for _, batch in _batches(EventDataset, out, chosen, sampling):
        columns = {**batch.fixed, **{name: r.values for name, r in batch.ragged.items()}}
        sample.add(batch.n, columns, {c: batch.offsets(c) for c in sample.schema.counters})
    return event_sections(sample, said=_said(chosen, sampling, sample.events, "events"))


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
    said = _said(chosen, sampling, sample.events, "samples")
    return event_sections(sample, said=said) + tar_sections(out, manifest, sampling, images=False)


def memmap_sections(out: Path, manifest: dict[str, Any], sampling: Sampling) -> list[Section]:
    """The values as stored (in the arrays' dtype, truncated to --max-len); the multiplicity is the
    count of values each event had before truncation."""
    chosen = picked(manifest, sampling, cap=sampling.max_samples)
    sample = EventSample(schema=EventSchema.from_json(manifest["schema"]))
    counter = manifest["memmap"]["counter"]
    for ds, batch in _batches(MemmapDataset, out, chosen, sampling):
        kept = np.arange(ds.max_len)[None, :] < batch["lengths"][:, None]  # (B, L): stored, not padding
        columns = {name: batch["values"][..., f][kept] for f, name in enumerate(ds.fields)}
        columns.update(batch["scalars"])
        offsets = np.concatenate([[0], np.cumsum(batch["counts"])])
        sample.add(len(batch["lengths"]), columns, {counter: offsets})
    return event_sections(sample, said=_said(chosen, sampling, sample.events, "events"))


def _batches(dataset: Any, out: Path, chosen: dict[str, tuple[int, np.ndarray]], sampling: Sampling
             ) -> Iterator[tuple[Any, Any]]:
    """(dataset, batch) for each chosen split's sampled events, ``BLOCK`` at a time through
    ``dataset(out, split=)``'s ``get_batch``, until the report's deadline."""
    for split, (_, idx) in chosen.items():
        ds = dataset(out, split=split)
        try:
            for a in range(0, len(idx), BLOCK):
                if sampling.late():
                    break
                yield ds, ds.get_batch(idx[a:a + BLOCK])
        finally:
            close = getattr(ds, "close", None)
            if close is not None:
                close()


def _said(chosen: dict[str, tuple[int, np.ndarray]], sampling: Sampling, events: int, unit: str) -> str:
    read = sum(len(i) for _, i in chosen.values())
    late = " Stopped at the time limit." if sampling.late() else ""
    return f"{sampled_note(chosen, sampling, unit)} {events:,} events read.{late}" if read else "No events."
