"""The webdataset format's encoders: a neutral sample (``kit/sample.py``) as a run of tar members.

Rows (``TarMembers``): each ``bytes`` field becomes a member of its own, named after the field (``core.field_names``),
in the sample's order; every other field (text, numbers, lists, arrays) goes into one ``json``
member, the fields in order, written by orjson (a value JSON cannot hold as its str, a numpy
value as JSON's); the document text ``--text-field`` named comes last, as the ``txt`` member. The
gather then only appends the bytes the workers made (``writer.TarWriter``). Images
(``ImageMembers``): the image as ``{key}.{ext}``, then its class as ``{key}.cls``; an unchanged file's
bytes (``FileBytes``) go as a reference the tar writer copies from the input file (``SourceRef``),
so an image is read once to check it and once to write it, never spilled."""

from __future__ import annotations

from typing import Any

import orjson

from shardsmith.core.field_names import safe_name
from shardsmith.formats.webdataset.tarfmt import member_header, sample_members
from shardsmith.formats.webdataset.writer import SourceRef
from shardsmith.kit.sample import FileBytes, RecordError, Sample, SampleEncoder

_BINARY = (bytes, bytearray)


class TarMembers(SampleEncoder):
    """Rows (and every kind written as rows) into tar members; the module docstring has the layout."""

    def encode(self, sample: Sample) -> list[Any]:
        return sample_members(sample.key, members(sample))

    def schema(self, fields: dict[str, Any], *, text_from: str | None) -> dict[str, Any]:
        """The members the described fields make: ``json`` for all but the binary ones, each binary
        field (or the source's description of those) a member of its own, then ``txt``."""
        binary = {name: field for name, field in fields.items() if field.get("kind") == "bytes"}
        return {**({"json": {"kind": "json"}} if len(binary) < len(fields) else {}), **binary,
                **({"txt": {"kind": "text", "from": text_from}} if text_from else {})}


class ImageMembers(SampleEncoder):
    """Images (``kit/image_processor.py``'s fields) into tar members; ``by_reference``: the writers
    copy the input files (``WriteJob.sources``), so unchanged bytes go as references."""

    def __init__(self, *, by_reference: bool) -> None:
        self.by_reference = by_reference
        self._labels: dict[int, bytes] = {}  # each class's ``cls`` member, made once

    def encode(self, sample: Sample) -> list[Any]:
        fields = sample.fields
        image, ext, cls = fields["image"], fields["ext"], fields["cls"]
        label = self._labels.get(cls) or self._labels.setdefault(cls, str(cls).encode())
        if isinstance(image, FileBytes):
            if self.by_reference:
                ref = SourceRef(index=image.file, size=len(image.data))
                return [member_header(f"{sample.key}.{ext}", ref.size), ref.pack(),
                        *sample_members(sample.key, [("cls", label)])]
            image = image.data
        return sample_members(sample.key, [(ext, image), ("cls", label)])

    def schema(self, fields: dict[str, Any], *, text_from: str | None) -> dict[str, Any]:
        return fields  # (the image source names the members: ``image`` by its extension, ``cls``)


def members(sample: Sample) -> list[tuple[str, bytes]]:
    """A sample's members as ``(extension, bytes)``: binary fields, ``json``, ``txt``. (Lean: once
    per row; a row without binary fields, JSONL's always, is dumped as it is.)"""
    fields = sample.fields
    out: list[tuple[str, bytes]] = []
    rest = fields
    for value in fields.values():
        if isinstance(value, _BINARY):
            out = [(safe_name(name), bytes(v)) for name, v in fields.items() if isinstance(v, _BINARY)]
            rest = {name: v for name, v in fields.items() if not isinstance(v, _BINARY)}
            break
    if rest:
        out.append(("json", _json(rest)))
    if sample.text is not None:
        out.append(("txt", sample.text.encode("utf-8")))
    return out


def _json(fields: Any) -> bytes:
    """orjson writes 254 levels of nesting where it reads 1,024: a deeper row is a bad record, not a traceback."""
    try:
        return orjson.dumps(fields, default=str, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        deep = ": it nests lists and objects more than 254 levels deep" if "ecursion" in str(exc) else ""
        raise RecordError(f"the object cannot be written back as JSON ({exc}{deep})") from None
