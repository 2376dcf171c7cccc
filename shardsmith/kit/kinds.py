"""The built-in record kinds (``kit/record_kind.py`` has the contract), registered in ``registry.py``.

Rows and images become tar samples with ``convert``'s own steps (``commands/convert.py``), events
with those of ``commands/convert_events.py``; each kind's report sections on raw inputs are in
``kit/sections/raw_inputs.py``, imported when a report is drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsmith.kit.record_kind import RecordKind

if TYPE_CHECKING:
    from shardsmith.core.input_file import InputFile
    from shardsmith.kit.sections.model import Sampling, Section


class RowsKind(RecordKind):
    """A dict of fields per record (JSONL lines, Parquet rows); its tar members from ``Reader.fields``."""

    name = "rows"
    convert_steps = "shardsmith.commands.convert:RowSteps"
    text_fields = True

    def report(self, reader: Any, files: list[InputFile], sampling: Sampling) -> list[Section]:
        from shardsmith.kit.sections.raw_inputs import rows_sections

        return rows_sections(reader, files, sampling)


class ImagesKind(RecordKind):
    """``(InputFile, bytes)`` per image file, labelled by its class folder (``Reader.classes``)."""

    name = "images"
    convert_steps = "shardsmith.commands.convert:ImageSteps"

    def report(self, reader: Any, files: list[InputFile], sampling: Sampling) -> list[Section]:
        from shardsmith.kit.sections.raw_inputs import images_sections

        return images_sections(reader, files, sampling)


class EventsKind(RecordKind):
    """``EventChunk`` columns of many events at once (a columnar source), described by its ``schema``."""

    name = "events"
    convert_steps = "shardsmith.commands.convert_events:EventSteps"
    draws_fields = True

    def report(self, reader: Any, files: list[InputFile], sampling: Sampling) -> list[Section]:
        from shardsmith.kit.sections.raw_inputs import events_sections

        return events_sections(reader, files, sampling)
