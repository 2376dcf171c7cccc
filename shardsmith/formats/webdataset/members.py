"""The webdataset format's encoder: a neutral sample (``kit/sample.py``) as a run of tar members.

Each ``bytes`` field becomes a member of its own, named after the field (``core.field_names``),
in the sample's order; every other field (text, numbers, lists, arrays) goes into one ``json``
member, the fields in order, written by orjson (a value JSON cannot hold as its str, a numpy
value as JSON's); the document text ``--text-field`` named comes last, as the ``txt`` member. The
gather then only appends the bytes the workers made (``writer.TarWriter``)."""

from __future__ import annotations

from typing import Any

import orjson

from shardsmith.core.field_names import safe_name
from shardsmith.formats.webdataset.tarfmt import sample_members
from shardsmith.kit.reader import RecordError
from shardsmith.kit.sample import Sample, SampleEncoder


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


def members(sample: Sample) -> list[tuple[str, bytes]]:
    """A sample's members as ``(extension, bytes)``: binary fields, ``json``, ``txt``."""
    out: list[tuple[str, bytes]] = []
    rest: dict[str, Any] = {}
    for name, value in sample.fields.items():
        if isinstance(value, bytes | bytearray):
            out.append((safe_name(name), bytes(value)))
        else:
            rest[name] = value
    if rest:
        out.append(("json", _json(rest)))
    if sample.text is not None:
        out.append(("txt", sample.text.encode("utf-8")))
    return out


def _json(fields: dict[str, Any]) -> bytes:
    """orjson writes 254 levels of nesting where it reads 1,024: a deeper row is a bad record, not a traceback."""
    try:
        return orjson.dumps(fields, default=str, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        deep = ": it nests lists and objects more than 254 levels deep" if "ecursion" in str(exc) else ""
        raise RecordError(f"the object cannot be written back as JSON ({exc}{deep})") from None
