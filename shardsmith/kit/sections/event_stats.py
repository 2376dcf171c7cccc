"""Events (``hdf5``, ``event-tar``, and raw ROOT or Parquet events): values per event for each
counter (multiplicity), a histogram per field with its NaN and infinity counts, and the balance of
the categorical fields (fixed integer scalars with few values: labels, flavours, flags).

Each reader hands over columns as ``EventChunk`` holds them (fixed fields ``(n, *shape)``, ragged
fields' flat values, ``offsets`` per counter) to an ``EventSample``; this module draws it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema
from shardsmith.core.words import plural
from shardsmith.errors import UsageError
from shardsmith.kit.sections import figures
from shardsmith.kit.sections.model import SUMMARY_HEADER, Section, Table, summary_row

MAX_VALUES = 1_000_000  # values kept per field (the statistics count what was kept)
MAX_PANELS = 24  # fields drawn (12 a figure); every field is in the table
MAX_CATEGORIES = 20  # a fixed integer field with more distinct values is not a category
MAX_BALANCE = 9  # categorical fields drawn (one figure)


@dataclass(kw_only=True)
class EventSample:
    schema: EventSchema
    events: int = 0
    values: dict[str, list[np.ndarray]] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    multiplicity: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, n: int, columns: dict[str, np.ndarray], offsets: dict[str, np.ndarray]) -> None:
        """``n`` events: ``columns`` as in an ``EventChunk``, ``offsets`` (n + 1) per counter."""
        self.events += n
        for c in self.schema.counters:
            if c in offsets:
                self.multiplicity.setdefault(c, []).append(np.diff(np.asarray(offsets[c], np.int64)))
        for f in self.schema.fields:
            col = columns.get(f.name)
            if col is None or self.kept.get(f.name, 0) >= MAX_VALUES:
                continue
            flat = np.asarray(col).reshape(-1)[:MAX_VALUES - self.kept.get(f.name, 0)]
            self.values.setdefault(f.name, []).append(flat)
            self.kept[f.name] = self.kept.get(f.name, 0) + len(flat)

    def add_sample(self, sample: dict[str, Any], *, per_sample: int) -> None:
        """One tar sample of ``per_sample`` events (``{counter}.offsets`` members when more than one)."""
        columns, offsets = {}, {}
        fixed = self.schema.fixed
        n = 1 if per_sample == 1 else (len(sample[fixed[0].name]) if fixed else 0)  # the last window may be short
        for f in self.schema.fields:
            value = np.asarray(sample[f.name])
            columns[f.name] = value if f.ragged or per_sample > 1 else value.reshape(1, *value.shape)
        for c in self.schema.counters:
            first = self.schema.members(c)[0].name
            offsets[c] = sample.get(f"{c}.offsets", np.array([0, len(columns[first])]))
            n = n or len(offsets[c]) - 1
        self.add(n, columns, offsets)


def check_field_names(schema: EventSchema, fields: tuple[str, ...] | None) -> None:
    """``--fields`` names fields of these events, or the error lists them (before a dataset's events are read)."""
    known = [f.name for f in schema.fields]
    unknown = [f for f in fields or () if f not in known]
    if unknown:
        raise UsageError(f"--fields: no field {', '.join(map(repr, unknown))} in these events (fields: "
                         f"{', '.join(known)})")


def event_sections(sample: EventSample, *, said: str, fields: tuple[str, ...] | None = None) -> list[Section]:
    """Multiplicity, per-field histograms and categorical balance; ``said``: what was read, for the notes;
    ``fields``: the fields to draw (``inspect --report --fields``; None: every one up to ``MAX_PANELS``)."""
    check_field_names(sample.schema, fields)
    sections = []
    if sample.multiplicity:
        sections.append(_multiplicity(sample, said))
    sections.append(_fields(sample, said, fields))
    cats = _categories(sample)
    if cats:
        sections.append(cats)
    return sections


def _joined(sample: EventSample, name: str) -> np.ndarray:
    parts = sample.values.get(name) or [np.zeros(0)]
    return np.concatenate(parts)


def _multiplicity(sample: EventSample, said: str) -> Section:
    section = Section(title="Multiplicity (values per event)")
    section.notes.append(said)
    counts = {c: np.concatenate(v) for c, v in sample.multiplicity.items()}
    section.tables.append(Table(caption="Values per event, per counter", header=SUMMARY_HEADER,
                                rows=[summary_row(c, v, "values per event") for c, v in counts.items()]
                                + [(f"{c}: empty events", int((v == 0).sum()), "", "", "", "", "events")
                                   for c, v in counts.items()]))
    panels = [(f"counter {c} ({', '.join(f.name for f in sample.schema.members(c))[:50]})", v,
               "values per event") for c, v in counts.items()]
    section.figures.append(figures.hist_grid("multiplicity", title="Multiplicity: values per event, per counter",
                                             panels=panels[:MAX_PANELS], ylabel="events", cols=min(3, len(panels))))
    if len(panels) > MAX_PANELS:
        section.notes.append(f"The first {MAX_PANELS} of {plural(len(panels), 'counter')} are drawn; every one is in the table.")
    return section


def _fields(sample: EventSample, said: str, chosen: tuple[str, ...] | None) -> Section:
    section = Section(title="Fields")
    section.notes.append(said + " Histograms show the finite values; NaN and infinities are counted in the table.")
    rows, panels, constant, left_out = [], [], [], []
    for f in sample.schema.fields:
        v = _joined(sample, f.name)
        kind = f"ragged ({f.counter})" if f.ragged else "per event"
        shape = "x".join(map(str, f.shape)) or "scalar"
        if v.dtype.kind == "b":
            v = v.astype(np.int8)
        if v.dtype.kind not in "iuf":
            rows.append((f.name, kind, f.dtype, shape, len(v), "", "", "", "", "", ""))
            continue
        x = v.astype(np.float64)
        finite = np.isfinite(x)
        nan, pinf, ninf = int(np.isnan(x).sum()), int((x == np.inf).sum()), int((x == -np.inf).sum())
        good = x[finite]
        stats = (f"{good.min():.4g}", f"{good.mean():.4g}", f"{good.max():.4g}") if len(good) else ("", "", "")
        rows.append((f.name, kind, f.dtype, shape, len(v), nan, pinf, ninf, *stats))
        if chosen is not None and f.name not in chosen:
            continue
        if len(good) and good.min() == good.max():  # one value: a line of text, not a solid block
            constant.append(f"{f.name} = {good[0]:.6g}")
        elif len(panels) < MAX_PANELS:
            bad = f" (NaN {nan:,}, inf {pinf + ninf:,})" if nan or pinf or ninf else ""
            panels.append((f"{f.name}{bad}", good, f"value ({kind})"))
        else:
            left_out.append(f.name)
    section.tables.append(Table(caption="Every field (over the values read)",
                                header=("field", "kind", "dtype", "shape", "values", "NaN", "+inf", "-inf",
                                        "min", "mean", "max"), rows=rows))
    for k in range(0, len(panels), 12):
        part = panels[k:k + 12]
        section.figures.append(figures.hist_grid(f"fields-{k // 12 + 1}", title=f"Field values ({k + 1} to "
                                                 f"{k + len(part)} of {len(panels)} drawn)",
                                                 panels=part, ylabel="values"))
    if constant:
        section.notes.append(f"Constant in the events read (not drawn): {'; '.join(constant)}.")
    if left_out:
        section.notes.append(f"{plural(len(left_out), 'field')} not drawn ({MAX_PANELS} at most): {', '.join(left_out)}. "
                             "Choose the fields to draw with inspect --report DIR --fields A,B,...; every field is in "
                             "the table.")
    elif chosen is not None:
        section.notes.append(f"Drawn: the fields --fields names ({len(chosen)} of {len(sample.schema.fields)}); "
                             "every field is in the table.")
    return section


def _categories(sample: EventSample) -> Section | None:
    counters = set(sample.schema.counters)
    found = []
    for f in sample.schema.fixed:
        if f.shape or f.name in counters or f.np_dtype.kind not in "iub":
            continue
        v = _joined(sample, f.name).astype(np.int64)
        values, n = np.unique(v, return_counts=True)
        if 1 < len(values) <= MAX_CATEGORIES:
            found.append((f.name, values, n))
    if not found:
        return None
    section = Section(title="Label balance")
    section.notes.append(f"Fixed integer fields with 2 to {MAX_CATEGORIES} distinct values in the events read "
                         "(labels, flavours, flags).")
    for name, values, n in found:
        section.tables.append(Table(caption=f"Field {name}", header=("value", "events", "share"),
                                    rows=[(int(a), int(b), f"{b / n.sum():.2%}") for a, b in zip(values, n)]))
    panels = [(f"Balance of {name}", [str(int(a)) for a in values], n, f"{name} value")
              for name, values, n in found[:MAX_BALANCE]]
    section.figures.append(figures.bar_grid("balance", title="Label balance: events per value", panels=panels,
                                            ylabel="events"))
    if len(found) > MAX_BALANCE:
        section.notes.append(f"The first {MAX_BALANCE} are drawn; every one is in the tables.")
    return section
