"""The report of tar datasets (``webdataset``, and ``event-tar`` after its events): members and
bytes per sample, and, when the samples hold images, the images section. Samples are read through
the loader's ``TarDataset`` (its member tables give the sizes without decoding anything)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.images import EXTENSIONS, pixel_limit
from shardsmith.formats.webdataset.dataset import TarDataset
from shardsmith.kit.sections import figures
from shardsmith.kit.sections.dataset_sample import picked, sampled_note
from shardsmith.kit.sections.image_stats import ImageSample, image_sections
from shardsmith.kit.sections.model import SUMMARY_HEADER, Sampling, Section, Table, summary_row

MAX_MEMBER_PANELS = 9


def tar_sections(out: Path, manifest: dict[str, Any], sampling: Sampling, *, images: bool = True) -> list[Section]:
    """Members and bytes per sample; images and classes when the samples hold images."""
    chosen = picked(manifest, sampling, cap=sampling.max_samples)
    per_ext: dict[str, list[int]] = {}
    totals: list[int] = []
    found = ImageSample(classes=manifest.get("classes"))
    limit = pixel_limit(manifest)
    read = 0
    for split, (_, idx) in chosen.items():
        ds = TarDataset(out, split=split)
        labels: list[int] = []
        for i in idx.tolist():
            if sampling.late():
                break
            sizes = ds.member_sizes(i)
            read += 1
            totals.append(sum(sizes.values()))
            for ext, n in sizes.items():
                per_ext.setdefault(ext, []).append(n)
            pictures = [e for e in sizes if e.rsplit(".", 1)[-1].lower() in EXTENSIONS] if images else []
            if pictures or "cls" in sizes:
                sample = ds[i]
                for ext in pictures:
                    found.add(sample[ext], where=f"{split}[{i}] {sample['__key__']}.{ext}", max_pixels=limit)
                if isinstance(sample.get("cls"), int):
                    labels.append(sample["cls"])
        if labels:
            found.labels[split] = labels
        ds.release()
    section = Section(title="Samples and members")
    section.notes.append(sampled_note(chosen, sampling, "samples")
                         + (f" Stopped at the time limit ({sampling.seconds:.0f} s) after {read:,}." if
                            read < sum(len(i) for _, i in chosen.values()) else ""))
    section.tables.append(Table(caption="Bytes per sample and per member", header=(*SUMMARY_HEADER, "in samples"),
                                rows=[(*summary_row("whole sample", np.asarray(totals), "B"), f"{len(totals):,}")]
                                + [(*summary_row(f"member .{ext}", np.asarray(v), "B"), f"{len(v):,}")
                                   for ext, v in sorted(per_ext.items())]))
    if totals:
        section.figures.append(figures.hist("bytes-per-sample", title="Bytes per sample (all members)",
                                            values=np.asarray(totals), xlabel="bytes per sample (log scale)",
                                            log_x=True))
    if len(per_ext) > 1:
        panels = [(f".{ext}", np.asarray(v), "bytes") for ext, v in sorted(per_ext.items())][:MAX_MEMBER_PANELS]
        section.figures.append(figures.hist_grid("bytes-per-member", title="Bytes per member, by extension",
                                                 panels=panels, ylabel="samples"))
    out_sections = [section]
    if found.nbytes or found.labels:
        counted = ("in all samples" if all(len(i) == n for n, i in chosen.values())
                   else "in the sampled samples only")
        out_sections = image_sections(found, counted=counted) + out_sections
    return out_sections
