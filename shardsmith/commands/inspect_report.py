"""``shardsmith inspect ... --report DIR``: the HTML report of a dataset (its format's sections)
or of raw inputs (their source's sections), written by ``shardsmith.report``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from shardsmith import registry
from shardsmith.core import manifest as manifest_mod
from shardsmith.core.sizes import format_size
from shardsmith.core.words import plural
from shardsmith.errors import UsageError
from shardsmith.kit import manifest_io


def is_dataset(paths: tuple[str, ...]) -> bool:
    """One folder holding a manifest: a dataset; anything else: raw inputs."""
    return len(paths) == 1 and (Path(paths[0]) / manifest_mod.MANIFEST).is_file()


def check_fields(fields: tuple[str, ...] | None, *, holds: str, what: str) -> None:
    """``--fields`` names the fields a kind's report draws (``RecordKind.draws_fields``: events); given
    for images, rows or tokens it would be ignored."""
    if fields is not None and not registry.record_kind(holds).draws_fields:
        raise UsageError(f"--fields chooses the event fields a report draws; {what}, not events")


def _check_names(manifest: dict[str, Any], fields: tuple[str, ...]) -> None:
    from shardsmith.core.events import EventSchema
    from shardsmith.kit.sections.event_stats import check_field_names

    try:
        schema = EventSchema.from_json(manifest["schema"])
    except (KeyError, TypeError, ValueError):  # a plugin format's own schema: its report's event_sections checks
        return
    check_field_names(schema, fields)


def dataset_report(out: Path, folder: Path, *, seq_len: int | None, seed: int,
                   fields: tuple[str, ...] | None = None) -> Path:
    from shardsmith.kit.sections.model import Sampling
    from shardsmith.report import need_matplotlib
    from shardsmith.report.dataset import cleaning_section, splits_section

    need_matplotlib()
    m = manifest_io.load(out)
    fmt = registry.format_of(m, where=str(out))
    reader = registry.loaded("source").get(str((m.get("source") or {}).get("reader")))
    if fields is not None and reader is not None:  # before any event is read (else event_sections checks)
        check_fields(fields, holds=reader.holds, what=f"{out.name} is a {fmt.name} dataset of {reader.name} {reader.holds}")
        _check_names(m, fields)
    sampling = Sampling(seed=seed, seq_len=seq_len, fields=fields)
    cleaned = cleaning_section(m)
    sections = [splits_section(m, unit=fmt.sample_unit), *([cleaned] if cleaned else []), *fmt.report(out, m, sampling)]
    intro = [f"{out.name}: a {fmt.name} dataset written by shardsmith {m['tool_version']} on {m['created']}.",
             f"Command: {' '.join(map(str, m.get('command') or []))}",
             f"Large datasets are sampled (a seeded sample, seed {seed}, of at most {sampling.max_samples:,} "
             f"samples, {sampling.max_documents:,} document lengths and {sampling.max_tokens:,} tokens, read for "
             f"at most {sampling.seconds:.0f} s); each section says what it read."]
    return _write(folder, f"shardsmith report: {out.name}", intro, sections, sampling)


def inputs_report(paths: tuple[str, ...], folder: Path, *, source: str | None, seed: int,
                  fields: tuple[str, ...] | None = None) -> Path:
    from shardsmith.engine.choose import infer_source, suffixes_of
    from shardsmith.engine.inputs.files import discover
    from shardsmith.kit.sections.model import Sampling
    from shardsmith.report import need_matplotlib

    need_matplotlib()
    sources = registry.loaded("source")
    if source is None:
        files = discover(list(paths), suffixes=suffixes_of(sources))
        source = infer_source(files, sources)
    cls = sources.get(source) or registry.get("source", source)
    try:
        reader = cls()
    except TypeError as exc:  # a source that needs convert's options to be made
        raise UsageError(f"source {source!r} cannot be read without its conversion options ({exc})") from None
    check_fields(fields, holds=reader.holds, what=f"these {reader.name} inputs hold {reader.holds}")
    files = discover(list(paths), suffixes=reader.suffixes)
    sampling = Sampling(seed=seed, fields=fields)
    sections = reader.report(files, sampling)
    intro = [f"Raw inputs read as {reader.name}: {plural(len(files), 'file')}, {format_size(sum(f.size for f in files))}, "
             f"before any conversion.",
             "What was read: every file is listed; then a seeded sample (seed "
             f"{seed}) of at most {sampling.max_files} files and {sampling.max_tasks} byte ranges of each, the first "
             f"{sampling.records_per_task:,} records of each range (images: {sampling.max_samples:,} files at most), "
             f"for at most {sampling.seconds:.0f} s. Each section says what share it read."]
    return _write(folder, f"shardsmith report: {plural(len(files), reader.name + ' input')}", intro, sections, sampling)


def _write(folder: Path, title: str, intro: list[str], sections: list, sampling: object) -> Path:
    from shardsmith.report import html

    t0 = getattr(sampling, "started", time.monotonic())
    path = html.write(folder, title=title, intro=intro, sections=sections)
    figures = sum(len(s.figures) for s in sections)
    click.echo(f"{path}: {plural(len(sections), 'section')}, {plural(figures, 'figure')} (PNG beside it), "
               f"in {time.monotonic() - t0:.1f} s", err=True)
    return path
