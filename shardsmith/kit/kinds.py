"""The built-in record kinds (``kit/record_kind.py`` has the contract), registered in ``registry.py``.

Rows become samples that the format encodes and images tar samples, with ``convert``'s own steps
(``commands/convert.py``), events with those of ``commands/convert_events.py``; each kind's report
sections on raw inputs are in ``kit/sections/raw_inputs.py``, imported when a report is drawn."""

from __future__ import annotations

from shardsmith.kit.record_kind import RecordKind

_SECTIONS = "shardsmith.kit.sections.raw_inputs"


class RowsKind(RecordKind):
    """A dict of fields per record (JSONL lines, Parquet rows): a neutral sample (``Reader.sample_fields``),
    which the format encodes (``Format.encoder``: webdataset's tar members)."""

    name = "rows"
    convert_steps = "shardsmith.commands.convert:RowSteps"
    report_sections = f"{_SECTIONS}:rows_sections"
    text_fields = True


class ImagesKind(RecordKind):
    """``(InputFile, bytes)`` per image file, labelled by its class folder (``Reader.classes``)."""

    name = "images"
    convert_steps = "shardsmith.commands.convert:ImageSteps"
    report_sections = f"{_SECTIONS}:images_sections"


class EventsKind(RecordKind):
    """``EventChunk`` columns of many events at once (a columnar source), described by its ``schema``:
    one record per event, which the format encodes (``Format.encoder``: ``kit/event_codec.py``)."""

    name = "events"
    convert_steps = "shardsmith.commands.convert_events:EventSteps"
    report_sections = f"{_SECTIONS}:events_sections"
    draws_fields = True
