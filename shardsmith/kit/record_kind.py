"""The record-kind protocol: what a source's records are, and what that decides in every command.

A source names the kind of its records (``Reader.holds``: ``"rows"``, ``"images"``, ``"events"``,
or a plugin's own). A kind is a ``RecordKind`` subclass registered under that name
(``shardsmith.registry``; plugins through the ``shardsmith.kinds`` entry-point group), so that the
commands look it up and ask it, instead of comparing names (docs/design.md, "Plugins"):

- ``convert_steps``: the ``"module:attribute"`` of the ``JobSteps`` that ``convert`` takes for these
  records (what checks the options, makes the worker's processor and describes the manifest),
  imported only when converting: the steps live above this layer, with the command;
- ``written_as``: the kind whose payloads those steps make, so that every format that ``accepts``
  it writes these records too (a plugin kind made into samples as rows are, with the steps of
  rows, is written by every format of rows, each with its encoder for rows); the kind itself by default;
- ``text_fields``: records are dicts of named fields, one of which is the text ``--text-field``
  names: ``pack-tokens`` tokenizes them, ``trace`` shows them, ``--dedup`` compares them;
- ``draws_fields``: its report draws the fields ``inspect --report --fields`` names;
- ``report``: the ``inspect INPUT... --report`` sections on raw inputs of this kind (the
  ``Inputs`` section of every source comes first, from ``kit/sections/raw_inputs.py``): by default
  the function ``report_sections`` names (``"module:function"``, imported when a report is drawn);
- ``transforms``: the ``--transform`` objects for these records: those whose ``applies_to``
  names the kind, any other refused in one line before any work.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar

from shardsmith.errors import UsageError
from shardsmith.kit.transform import build_transforms

if TYPE_CHECKING:
    from shardsmith.core.input_file import InputFile
    from shardsmith.kit.sections.model import Sampling, Section
    from shardsmith.kit.transform import Transform


class RecordKind:
    """Base class of record kinds; the module docstring has the contract."""

    name: ClassVar[str] = ""
    convert_steps: ClassVar[str] = ""  # "module:attribute" of convert's JobSteps for these records
    written_as: ClassVar[str | None] = None  # the kind formats must accept to write these (None: this one)
    text_fields: ClassVar[bool] = False
    draws_fields: ClassVar[bool] = False
    report_sections: ClassVar[str] = ""  # "module:function" (reader, files, sampling) -> sections; "": none

    @property
    def payload_kind(self) -> str:
        """The kind a format's ``accepts`` must name to write these records."""
        return self.written_as or self.name

    def steps(self) -> type:
        """``convert``'s steps for these records, imported now; a one-line UsageError if they cannot be."""
        return self._imported(self.convert_steps, "convert steps")  # type: ignore[no-any-return]

    def _imported(self, target: str, what: str) -> Any:
        """The object a ``"module:attribute"`` names, imported now; a one-line UsageError if it cannot be."""
        module, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except Exception as exc:  # a plugin's import may fail any way at all
            raise UsageError(f"record kind {self.name!r}: cannot load its {what} {target!r} "
                             f"({type(exc).__name__}: {exc})") from None

    def transforms(self, texts: tuple[str, ...], *, opts: Any) -> list[Transform]:
        """The ``--transform`` options as transform objects for records of this kind."""
        return build_transforms(texts, holds=self.name, opts=opts)

    def report(self, reader: Any, files: list[InputFile], sampling: Sampling) -> list[Section]:
        """``inspect --report`` sections on a seeded sample of these records (``report_sections``'s)."""
        if not self.report_sections:
            return []
        sections = self._imported(self.report_sections, "report sections")
        return sections(reader, files, sampling)  # type: ignore[no-any-return]
