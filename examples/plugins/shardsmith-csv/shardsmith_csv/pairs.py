"""Key/value pairs: a record kind of the plugin's own (``pairs``), and a source that holds it.

A kind is what a source's records are (``shardsmith.plugin.RecordKind``, registered through the
``shardsmith.kinds`` entry-point group): ``PairsKind`` says that a record is a ``(key, value)``
pair of strings, that ``convert`` makes each one a sample with the steps it takes for rows (the
source's ``sample_fields`` gives the sample's fields, ``key`` and ``value``, which each format
encodes its own way), so that every format that writes rows writes pairs too (``written_as``: ``--to webdataset``, and
this package's ``--to csv``), that no built-in transform applies to them (the ``--transform``s whose
``applies_to`` names ``pairs``), and what ``inspect INPUT... --report`` shows of them (a table of
their keys).

``PropertiesSource`` (``properties``) reads the simple form of Java's ``.properties`` files: one
``key=value`` (or ``key: value``) per line, UTF-8, blank lines and ``#`` or ``!`` comments
skipped, without line continuations or escapes. A record's number is its line's (counted from 0),
so a message names the line; a line with neither ``=`` nor ``:`` is a bad record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from shardsmith.plugin import (
    BadRecord,
    InputFile,
    Reader,
    RecordKind,
    Sampling,
    Section,
    StreamError,
    Table,
    Task,
)

__all__ = ["PairsKind", "PropertiesSource"]

_MOST_KEYS = 50  # the report's table: the most common keys


class PairsKind(RecordKind):
    """``(key, value)`` pairs of strings; the module docstring says what the kind decides."""

    name = "pairs"
    convert_steps = "shardsmith.commands.convert:RowSteps"  # each record a sample of the source's members
    written_as = "rows"  # those members are a row's: every format of rows writes them

    def report(self, reader: Any, files: list[InputFile], sampling: Sampling) -> list[Section]:
        """The keys of a seeded choice of files (their first records), most common first."""
        chosen = sampling.pick(len(files), sampling.max_files, salt=4)
        keys: Counter[str] = Counter()
        lengths: dict[str, int] = {}
        pairs = bad = 0
        for i in chosen.tolist():
            if sampling.late():
                break
            task = Task(index=0, file=files[i])
            for k, (_, value) in enumerate(reader.read(task)):
                if k >= sampling.records_per_task:
                    break
                if isinstance(value, BadRecord):
                    bad += 1
                    continue
                pairs += 1
                keys[value[0]] += 1
                lengths[value[0]] = lengths.get(value[0], 0) + len(value[1])
        section = Section(title="Pairs")
        section.notes.append(f"{sampling.said(len(chosen), len(files), 'files')}: {pairs:,} pairs read, {bad:,} "
                             f"bad lines, {len(keys):,} distinct keys.")
        section.tables.append(Table(caption="Keys", header=("key", "pairs", "share", "mean value length"),
                                    rows=[(key, n, f"{n / max(pairs, 1):.1%}", f"{lengths[key] / n:.1f}")
                                          for key, n in keys.most_common(_MOST_KEYS)],
                                    note=f"the {_MOST_KEYS} most common" if len(keys) > _MOST_KEYS else ""))
        return [section]


class PropertiesSource(Reader):
    """A source of ``pairs`` from ``.properties`` files (the module docstring has the format)."""

    name = "properties"
    suffixes = (".properties",)
    unit = "line"
    holds = "pairs"

    def sample_fields(self, value: Any) -> dict[str, Any]:
        """The pair as a sample's two fields, ``key`` and ``value`` (strings): the format writes them
        (``--to webdataset``: one ``json`` member ``{"key": ..., "value": ...}``; ``--to csv``: two columns)."""
        key, text = value
        return {"key": key, "value": text}

    def sample_schema(self, opts: Any) -> dict[str, Any]:
        return {"key": {"kind": "text"}, "value": {"kind": "text"}}

    def read(self, task: Task) -> Iterator[tuple[int, Any]]:
        line_no = 0
        try:
            with open(task.file.path, "rb") as fh:
                for line_no, raw in enumerate(fh):
                    if self.max_record_bytes is not None and len(raw) > self.max_record_bytes:
                        yield line_no, BadRecord(f"a line of {len(raw)} bytes is longer than the "
                                                 f"{self.max_record_bytes} one record may take within --memory")
                        continue
                    try:
                        line = raw.decode("utf-8").strip()
                    except UnicodeDecodeError as exc:
                        yield line_no, BadRecord(f"invalid UTF-8 at byte {exc.start} of the line")
                        continue
                    if not line or line.startswith(("#", "!")):
                        continue
                    cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
                    if cut <= 0:
                        yield line_no, BadRecord("not a key=value or key: value line")
                        continue
                    yield line_no, (line[:cut].strip(), line[cut + 1:].strip())
        except OSError as exc:
            yield line_no, StreamError(f"cannot read: {exc}")
