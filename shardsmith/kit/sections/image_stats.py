"""The images section: class counts, image sizes (from the headers, nothing decoded), bytes per image.

Shared by tar datasets (``webdataset``, ``event-tar``) and raw image folders (``raw_inputs``): both
hand over what they sampled as an ``ImageSample``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardsmith.core.images import ImageError, check_image
from shardsmith.core.words import plural
from shardsmith.kit.sections import figures
from shardsmith.kit.sections.model import SUMMARY_HEADER, Section, Table, summary_row

MAX_BARS = 50  # classes drawn; every class is in the table
MAX_LABEL = 1 << 20  # labels counted (a crafted label of 10**12 must not allocate its count array)


@dataclass(kw_only=True)
class ImageSample:
    """What was read of some images: labels by group (split or input), sizes, bytes, bad images."""

    classes: list[str] | None = None  # names by label, when known
    labels: dict[str, list[int]] = field(default_factory=dict)  # group -> label of each image read
    counts: dict[str, np.ndarray] | None = None  # group -> exact count per label (a listing knows them)
    widths: list[int] = field(default_factory=list)
    heights: list[int] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    formats: dict[str, int] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)  # "where: why", the first few

    def add(self, data: bytes | memoryview, *, where: str, max_pixels: int) -> None:
        """One image's size from its header (no pixel decoded)."""
        self.nbytes.append(len(data))
        try:
            info = check_image(data, level="header", max_pixels=max_pixels)
        except ImageError as exc:
            if len(self.bad) < 20:
                self.bad.append(f"{where}: {exc}")
            return
        if info is not None:
            self.widths.append(info.width)
            self.heights.append(info.height)
            self.formats[info.format] = self.formats.get(info.format, 0) + 1


def image_sections(sample: ImageSample, *, counted: str) -> list[Section]:
    """Class counts (``counted``: how they were counted, said in the report), then sizes and bytes."""
    out = []
    labels = {g: np.asarray(v, np.int64) for g, v in sample.labels.items() if len(v)}
    odd = sum(int(((v < 0) | (v >= MAX_LABEL)).sum()) for v in labels.values())
    counts = sample.counts or {g: np.bincount(v[(v >= 0) & (v < MAX_LABEL)], minlength=len(sample.classes or ()))
                               for g, v in labels.items()}
    if counts:
        out.append(_classes(counts, sample.classes, counted))
        if odd:
            out[-1].notes.append(f"{plural(odd, 'label')} below 0 or from {MAX_LABEL:,} up are left out of the counts.")
    if not sample.nbytes:
        return out
    section = Section(title="Images")
    w, h = np.asarray(sample.widths, np.float64), np.asarray(sample.heights, np.float64)
    section.notes.append(f"{plural(len(sample.nbytes), 'image')} read; sizes from the image headers (no pixel decoded).")
    if sample.bad:
        section.notes.append(f"{plural(len(sample.bad), 'image')} whose header could not be read: " + "; ".join(sample.bad[:5]))
    section.tables.append(Table(caption="Image sizes and bytes", header=SUMMARY_HEADER, rows=[
        summary_row("width", w, "px"), summary_row("height", h, "px"),
        summary_row("pixels", w * h / 1e6, "megapixels"), summary_row("bytes per image", np.asarray(sample.nbytes), "B")]))
    if sample.formats:
        section.tables.append(Table(caption="Encodings", header=("format", "images"),
                                    rows=sorted(sample.formats.items())))
    if len(w):
        section.figures.append(figures.scatter("image-sizes", title="Image sizes (width x height)", x=w, y=h,
                                               xlabel="width (pixels)", ylabel="height (pixels)"))
        sizes, n = np.unique(np.stack([w, h], 1), axis=0, return_counts=True)
        top = np.argsort(-n, kind="stable")[:20]
        section.tables.append(Table(caption="Most common sizes", header=("width (px)", "height (px)", "images"),
                                    rows=[(int(sizes[k][0]), int(sizes[k][1]), int(n[k])) for k in top]))
    if sample.nbytes:
        section.figures.append(figures.hist("bytes-per-image", title="Bytes per image", values=np.asarray(sample.nbytes),
                                            xlabel="encoded size (bytes, log scale)", log_x=True))
    out.append(section)
    return out


def _classes(counts: dict[str, np.ndarray], classes: list[str] | None, counted: str) -> Section:
    width = max(len(c) for c in counts.values())
    names = list(classes or []) + [str(i) for i in range(len(classes or []), width)]
    table = np.zeros((len(counts), width), np.int64)
    for row, c in enumerate(counts.values()):
        table[row, :len(c)] = c
    total = table.sum(0)
    section = Section(title="Classes")
    section.notes.append(f"{plural(len(names), 'class')}; counts {counted}."
                         + ("" if classes else " No class names are recorded: labels are shown as numbers."))
    groups = list(counts)
    share = total / max(int(total.sum()), 1)
    section.tables.append(Table(caption="Images per class", header=("label", "class", *groups, "total", "share"),
                                rows=[(i, names[i], *(int(x) for x in table[:, i]), int(total[i]), f"{share[i]:.2%}")
                                      for i in range(width)]))
    order = np.argsort(-total, kind="stable")[:MAX_BARS] if width > MAX_BARS else np.arange(width)
    title = "Images per class" + (f" (the {MAX_BARS} largest of {width})" if width > MAX_BARS else "")
    section.figures.append(figures.bar("class-counts", title=title, labels=[names[i] for i in order],
                                       values=total[order], xlabel="class", ylabel="images"))
    if total.max() > 0:
        section.notes.append(f"largest / smallest class: {int(total.max()):,} / {plural(int(total.min()), 'image')}.")
    return section
