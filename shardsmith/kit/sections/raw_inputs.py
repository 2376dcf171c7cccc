"""Raw inputs before any conversion (image folders, JSONL, Parquet, ROOT): what ``inspect INPUT...
--report`` reads, and how it samples, so that a 10 GB input takes well under a minute.

Every input is listed (sizes, and an image folder's classes, come from the listing, exactly).
Then a seeded sample: at most ``max_files`` files; in each, at most ``max_tasks`` byte ranges
(``Reader.sample_tasks``: seeded offsets in a big JSONL file, row groups of Parquet, clusters
of ROOT) and the first ``records_per_task`` records of each; images, a seeded sample of
``max_samples`` files, read from their headers. Reading stops at ``seconds``. The report says
what share was read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from shardsmith.core.images import MAX_IMAGE_PIXELS
from shardsmith.core.sizes import format_size
from shardsmith.core.words import plural
from shardsmith.kit.sections import figures
from shardsmith.kit.sections.event_stats import EventSample, event_sections
from shardsmith.kit.sections.image_stats import ImageSample, image_sections
from shardsmith.kit.sections.model import SUMMARY_HEADER, Sampling, Section, Table, summary_row

if TYPE_CHECKING:
    from shardsmith.core.input_file import InputFile
    from shardsmith.kit.record_kind import RecordKind

HOW = ("a seeded choice of files; in each, a seeded choice of byte ranges (seeded offsets in a big JSONL file, "
       "row groups of Parquet, clusters of ROOT) and the first records of each range; images: a seeded choice of "
       "files, read from their headers; an image folder's class counts come from the listing, exactly. Reading "
       "stops at a time limit.")
CHUNK = 16 << 20  # bytes of a planned range
MAX_IMAGES = 5_000
MAX_FIELD_PANELS = 12


class Reader(Protocol):
    """What these sections use of a ``kit.reader.Reader`` (whose ``report`` calls them: named here by
    its shape, not imported, so that the two modules do not import each other)."""

    @property
    def name(self) -> str: ...

    def sample_tasks(self, file: InputFile, *, count: int, chunk_bytes: int, rng: Any) -> list[Any]: ...

    def read(self, task: Any) -> Iterator[tuple[int, Any]]: ...


def raw_sections(reader: Reader, files: list[InputFile], sampling: Sampling, kind: RecordKind) -> list[Section]:
    """The inputs' sections: every source's ``Inputs``, then its record kind's (``RecordKind.report``:
    a plugin source of a built-in kind gets the same, a plugin kind its own)."""
    return [_inputs(reader, files, sampling), *kind.report(reader, files, sampling)]


def _inputs(reader: Reader, files: list[InputFile], sampling: Sampling) -> Section:
    sizes = np.array([f.size for f in files], np.float64)
    section = Section(title="Inputs")
    section.notes.append(f"{plural(len(files), reader.name + ' file')}, {format_size(sizes.sum())} in all (every file listed). "
                         f"How the records are sampled: {HOW}")
    section.tables.append(Table(caption="Input files", header=SUMMARY_HEADER,
                                rows=[summary_row("file size", sizes / 1e6, "MB")]))
    section.figures.append(figures.hist("input-sizes", title="Input file sizes", values=sizes / 1e6,
                                        xlabel="size (MB, log scale)", ylabel="files", log_x=True))
    return section


def images_sections(reader: Reader, files: list[InputFile], sampling: Sampling) -> list[Section]:
    groups = Counter(f.group for f in files)
    classes = sorted(groups)
    found = ImageSample(classes=classes, counts={"all inputs": np.array([groups[c] for c in classes], np.int64)})
    idx = sampling.pick(len(files), min(sampling.max_samples, MAX_IMAGES), salt=3)
    read = 0
    for i in idx.tolist():
        if sampling.late():
            break
        with open(files[i].path, "rb") as fh:
            found.add(fh.read(), where=files[i].rel, max_pixels=MAX_IMAGE_PIXELS)
        read += 1
    sections = image_sections(found, counted="of every file in the listing (exact)")
    sections[-1].notes.insert(0, "Image sizes: " + sampling.said(read, len(files), "image files") + ".")
    return sections


def _tasks(reader: Reader, files: list[InputFile], sampling: Sampling) -> tuple[list[Any], str]:
    chosen = sampling.pick(len(files), sampling.max_files, salt=4)
    rng = sampling.rng(5)
    tasks = [t for i in chosen.tolist()
             for t in reader.sample_tasks(files[i], count=sampling.max_tasks, chunk_bytes=CHUNK, rng=rng)]
    total = sum(f.size for f in files)
    picked = sum(files[i].size for i in chosen.tolist())
    said = (f"Files: {sampling.said(len(chosen), len(files), 'files')} ({format_size(picked)} of "
            f"{format_size(total)}); {len(tasks):,} byte ranges of them, the first {sampling.records_per_task:,} "
            f"records of each.")
    return tasks, said


def rows_sections(reader: Reader, files: list[InputFile], sampling: Sampling) -> list[Section]:
    import orjson

    tasks, said = _tasks(reader, files, sampling)
    present: Counter[str] = Counter()
    kinds: dict[str, Counter[str]] = {}
    lengths: dict[str, list[float]] = {}
    rows = bad = nbytes = 0
    for task in tasks:
        if sampling.late():
            break
        for k, (_, value) in enumerate(reader.read(task)):
            if k >= sampling.records_per_task:
                break
            if not isinstance(value, dict):
                bad += 1
                continue
            rows += 1
            nbytes += len(orjson.dumps(value, default=str))
            for key, v in value.items():
                present[key] += 1
                kinds.setdefault(key, Counter())[type(v).__name__] += 1
                measure = _measure(v)
                if measure is not None:
                    lengths.setdefault(key, []).append(measure)
    section = Section(title="Records")
    share = f" About {min(1.0, nbytes / max(sum(f.size for f in files), 1)):.2%} of the input bytes (as JSON)."
    section.notes.append(f"{said} {plural(rows, 'record')} read, {bad:,} unreadable.{share}"
                         + (" Stopped at the time limit." if sampling.late() else ""))
    table = []
    for key, n in present.most_common():
        v = np.asarray(lengths.get(key, []), np.float64)
        table.append((key, n, f"{n / max(rows, 1):.1%}", ", ".join(f"{t} {c:,}" for t, c in kinds[key].most_common()),
                      int((~np.isfinite(v)).sum()), *summary_row("", v[np.isfinite(v)])[2:6]))
    section.tables.append(Table(caption="Fields (length in characters for text, items for lists, value for numbers)",
                                header=("field", "records", "share", "types", "NaN/inf", "min", "median", "mean", "max"),
                                rows=table))
    panels = [(key, _finite(lengths[key]), _unit(kinds[key])) for key, _ in present.most_common()
              if lengths.get(key)][:MAX_FIELD_PANELS]
    if panels:
        section.figures.append(figures.hist_grid("fields", title="Field values and lengths", panels=panels,
                                                 ylabel="records"))
    return [section]


def _finite(values: list[float]) -> np.ndarray:
    v = np.asarray(values, np.float64)
    return v[np.isfinite(v)]


def _measure(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str | bytes | list | dict):
        return float(len(v))
    return None


def _unit(kinds: Counter[str]) -> str:
    kind = kinds.most_common(1)[0][0]
    return {"str": "length (characters)", "bytes": "length (bytes)", "list": "length (items)",
            "dict": "keys"}.get(kind, "value")


def events_sections(reader: Reader, files: list[InputFile], sampling: Sampling) -> list[Section]:
    from shardsmith.core.events import EventChunk

    tasks, said = _tasks(reader, files, sampling)
    schema, skipped = reader.schema(files[:1] if not tasks else [tasks[0].file])  # type: ignore[attr-defined]
    sample = EventSample(schema=schema)
    for task in tasks:
        left = sampling.records_per_task
        for chunk in reader.read(task):
            if sampling.late() or left <= 0:
                break
            if not isinstance(chunk, EventChunk):
                continue
            if chunk.n > left:
                chunk = chunk.take(np.arange(left), schema)
            sample.add(chunk.n, chunk.columns, chunk.offsets)
            left -= chunk.n
    note = f"{said} {plural(sample.events, 'event')} read." + (" Stopped at the time limit." if sampling.late() else "")
    sections = event_sections(sample, said=note, fields=sampling.fields)
    if skipped:
        sections[0].notes.append(f"Fields left out (not numeric, or not convertible): {', '.join(skipped[:20])}"
                                 + (f", … ({len(skipped)} in all)" if len(skipped) > 20 else ""))
    return sections

