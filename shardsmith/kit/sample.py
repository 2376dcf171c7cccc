"""The neutral sample: a record as every format receives it, and the encoder that makes a format's bytes.

A source says what a record's fields are (``Reader.sample_fields``): names and typed values (``str``,
``bytes``, ``int``, ``float``, ``bool``, ``None``, a numpy array, or lists and dicts of those, as
JSON holds them). The worker makes them a ``Sample`` (with its key, and the document text that
``--text-field`` names) and hands it to the encoder the chosen format gives for the record kind
(``Format.encoder``): only the format decides how a sample becomes bytes (webdataset: tar members).
The encoder runs in the workers, so the gather only appends bytes, and it depends on the sample and
the format's own options only: the same bytes for any worker.

Image files become samples too (``kit/image_processor.py``: ``image``, ``ext``, ``cls``); an
unchanged file's bytes come as ``FileBytes``, which an encoder may reference instead of carrying.
A format that gives no encoder of its own gets ``NeutralEncoder``: the sample as typed, framed
bytes that its writer reads back whole with ``Sample.decode`` (no format's layout in them), so a new
format never parses another format's encoding; a chunk of events as ``kit/event_codec.py``'s records.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import orjson

from shardsmith.kit.event_codec import NeutralEventEncoder

# in a description of a sample's fields (``Reader.sample_schema``): every field it does not name,
# which a source knows only once it reads them (a JSON object's keys, a table's columns)
OTHER_FIELDS = "*"
TEXT = "__text__"  # the neutral schema's entry for the text ``--text-field`` names (beside ``__key__``)
KEY = "__key__"  # the sample's key where a format stores it beside the fields (as webdataset's loaders name it)
HEAD = struct.Struct("<I")  # a framed encoding's JSON header length, before it (the neutral one's, the rows')
JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


class RecordError(Exception):
    """A record that cannot become a sample (the message says why): a bad record, skippable.
    (``kit.reader`` gives it to sources under the same name.)"""


class Sample(NamedTuple):
    """One sample: its key (``core.sample.Identity``), its fields in the source's order, and the
    document text ``--text-field`` named (None without the option). Immutable, and a tuple: one is
    made per record in the workers, so it costs what a tuple costs (a frozen dataclass, 2.5x that)."""

    key: str
    fields: Mapping[str, Any]
    text: str | None = None

    def encode(self) -> bytes:
        """The neutral encoding (``NeutralEncoder``): a JSON header, then the bytes and arrays' data."""
        return b"".join(NeutralEncoder().encode(self))

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Sample:
        """A sample from its neutral encoding, typed as it was given: bytes as bytes, arrays as
        (read-only) numpy arrays of their dtype and shape, the other values as JSON reads them."""
        view = memoryview(data)
        (size,) = HEAD.unpack_from(view, 0)
        head = orjson.loads(view[HEAD.size:HEAD.size + size])
        pos = HEAD.size + size
        fields: dict[str, Any] = {}
        for name, kind, value in head["fields"]:
            if kind == "value":
                fields[name] = value
            else:
                fields[name], pos = unbinary(kind, value, view, pos)
        return cls(key=head["key"], fields=fields, text=head["text"])


class FileBytes(NamedTuple):
    """A field's bytes that are input file ``file``'s whole content, unchanged (an image not augmented):
    an encoder whose writers copy input files (``WriteJob.sources``) may write a reference to the
    file instead of carrying the bytes through the shuffle; any other takes ``data``."""

    data: bytes
    file: int


class SampleEncoder:
    """Worker side: a sample into the payload a format's writers are handed (``write_batch``'s
    bytes, one sample after another). ``encode`` returns the payload's pieces (joined by the
    caller); it raises ``RecordError`` (or ``ValueError``) for a sample the format cannot hold:
    a bad record. It is pickled to the workers, so it holds plain values (the format's options)."""

    def encode(self, sample: Sample) -> list[bytes]:
        raise NotImplementedError

    def schema(self, fields: dict[str, Any], *, text_from: str | None) -> dict[str, Any]:
        """The manifest's ``schema`` of the samples it encodes, from the source's description of their
        fields (``Reader.sample_schema``: name -> ``{"kind": ...}``, ``OTHER_FIELDS`` for those it
        cannot name) and the field the text came from (None: no text). By default the fields as
        described, and the text as ``__text__``."""
        return {**fields, **({TEXT: {"kind": "text", "from": text_from}} if text_from else {})}


class NeutralEncoder(SampleEncoder, NeutralEventEncoder):
    """The sample as it is, typed (``Sample.decode`` reads it back): what a format gets by default.
    Events too (``records``: ``kit/event_codec.py``'s neutral records), so that one default serves
    every kind a format accepts."""

    def encode(self, sample: Sample) -> list[bytes]:
        described: list[list[Any]] = []
        blobs: list[bytes] = []
        for name, value in sample.fields.items():
            blob = binary(value)
            if blob is None:
                described.append([name, "value", value])
            else:
                blobs.append(blob[2])
                described.append([name, blob[0], blob[1]])
        return framed({"key": sample.key, "text": sample.text, "fields": described}, blobs)


def binary(value: Any) -> tuple[str, list[Any], bytes] | None:
    """A field's value that a framed encoding carries after its JSON header, as (kind, what reads it
    back, its bytes): ``bytes`` ``[size]`` (``FileBytes``: its data), ``array`` ``[dtype, shape,
    size]``; None for a value the header's JSON holds."""
    if isinstance(value, FileBytes):
        value = value.data
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        return "bytes", [len(data)], data
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        data = array.tobytes()
        return "array", [array.dtype.str, list(array.shape), len(data)], data
    return None


def unbinary(kind: str, meta: list[Any], data: Any, pos: int) -> tuple[Any, int]:
    """``binary``'s value back from ``data`` at ``pos`` (bytes, or a read-only array), and where the next begins."""
    nbytes = meta[0] if kind == "bytes" else meta[2]
    blob = bytes(data[pos:pos + nbytes])
    value = blob if kind == "bytes" else np.frombuffer(blob, dtype=meta[0]).reshape(meta[1])
    return value, pos + nbytes


def framed(head: Any, blobs: list[bytes]) -> list[bytes]:
    """A framed encoding's pieces: the header's length, the header as JSON, the blobs' bytes. A value
    JSON cannot hold (a date, a decimal) is given as its str; one it cannot encode is a bad record."""
    try:
        data = orjson.dumps(head, default=str, option=JSON_OPTIONS)
    except orjson.JSONEncodeError as exc:
        raise RecordError(f"the record cannot be written ({exc})") from None
    return [HEAD.pack(len(data)), data, *blobs]
