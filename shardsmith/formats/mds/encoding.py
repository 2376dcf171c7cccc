"""MDS column encodings of a neutral sample's values, made in the workers (``MdsEncoder``).

MDS (mosaicml-streaming's ``mds`` format, version 2) stores a sample as its columns in the order
the shard's header names them: first a uint32 size for each column of variable size, then each
column's bytes. A column's *encoding* says how its bytes read back (``streaming``'s
``mds_decode``); the ones written here:

- ``str``: UTF-8 text; ``bytes``: as they are; ``jpeg`` / ``png``: an image file's bytes, which
  ``streaming`` opens as a PIL image (an image sample of that extension);
- ``int``: a Python int as little-endian int64 (read back as ``int``); ``float64``: a float
  (read back as ``numpy.float64``, a ``float``);
- ``ndarray:{dtype}:{shape}``: a numpy array of a dtype MDS names, its data as it lies (C order);
- ``json``: anything else (None, bools, lists, dicts, an int past int64, a value JSON cannot hold
  as its str), written by orjson; ``streaming`` reads it with ``json.loads``.

A sample's columns are its key (``__key__``, str: where it came from, as every shardsmith format
keeps it) and its fields, sorted by name as ``streaming.MDSWriter`` sorts them. The document text
``--text-field`` names is one of the fields already: no column of its own.

What the encoder hands the writer, per sample: ``[u16 header size][header][body]``, the header
naming the columns and encodings (JSON ``[[name, encoding], ...]``) and the body the MDS sample
bytes. Samples of one shard whose headers are the same bytes are written as their bodies; the
writer reconciles the others (``shard.py``).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from shardsmith.kit.sample import FileBytes, RecordError, Sample, SampleEncoder

KEY = "__key__"
HEAD = struct.Struct("<H")
_INT64 = struct.Struct("<q")
_FLOAT64 = struct.Struct("<d")
INT64_RANGE = (-(1 << 63), (1 << 63) - 1)
# numpy dtypes MDS's ndarray encoding names (``streaming``'s NDArray); others go as JSON
NDARRAY_DTYPES = frozenset(("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                            "float16", "float32", "float64"))
# encodings of a fixed size (the shard's ``column_sizes``); the others carry a uint32 size per sample
FIXED = {"int": 8, "float64": 8}
BINARY = frozenset(("bytes", "jpeg", "png"))  # encodings of bytes as they are: a column may mix them as ``bytes``
IMAGE_ENCODINGS = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png"}
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def column_size(encoding: str) -> int | None:
    """A column's fixed size in bytes (``column_sizes`` in the shard's header), None when variable."""
    if encoding.startswith("ndarray:"):
        _, dtype, shape = encoding.split(":")
        return int(np.prod([int(s) for s in shape.split(",")])) * np.dtype(dtype).itemsize
    return FIXED.get(encoding)


def to_json(value: Any) -> bytes:
    """A value as a ``json`` column holds it (a value JSON cannot hold, as its str: as webdataset's json)."""
    try:
        return orjson.dumps(value, default=str, option=_JSON_OPTIONS)
    except orjson.JSONEncodeError as exc:
        raise RecordError(f"the value cannot be written as JSON ({exc})") from None


def encode_value(value: Any) -> tuple[str, bytes]:
    """One field's (encoding, bytes)."""
    if isinstance(value, str):
        return "str", value.encode("utf-8")
    if isinstance(value, FileBytes):
        return "bytes", value.data
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes", bytes(value)
    if isinstance(value, bool | np.bool_):
        return "json", b"true" if value else b"false"
    if isinstance(value, int | np.integer) and INT64_RANGE[0] <= value <= INT64_RANGE[1]:
        return "int", _INT64.pack(int(value))
    if isinstance(value, float | np.floating):
        return "float64", _FLOAT64.pack(float(value))
    if isinstance(value, np.ndarray) and value.ndim and value.size and value.dtype.name in NDARRAY_DTYPES:
        shape = ",".join(str(s) for s in value.shape)
        return f"ndarray:{value.dtype.name}:{shape}", np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"),
                                                                                         copy=False).tobytes()
    return "json", to_json(value)


def sample_body(columns: list[tuple[str, str, bytes]]) -> list[bytes]:
    """The MDS sample bytes of columns (name, encoding, bytes) in their order: the variable ones'
    uint32 sizes, then every column's bytes."""
    sizes = [len(data) for _, encoding, data in columns if column_size(encoding) is None]
    return [struct.pack(f"<{len(sizes)}I", *sizes), *(data for _, _, data in columns)]


def frame(columns: list[tuple[str, str, bytes]]) -> list[bytes]:
    """The payload the writer is handed: the header naming the columns, then the sample's body."""
    header = orjson.dumps([[name, encoding] for name, encoding, _ in columns])
    return [HEAD.pack(len(header)), header, *sample_body(columns)]


class MdsEncoder(SampleEncoder):
    """Rows and images into MDS columns (the module docstring has the layout). An image's bytes
    are a ``jpeg`` or ``png`` column by the file's extension (``bytes`` for others)."""

    def __init__(self, *, images: bool = False) -> None:
        self.images = images

    def encode(self, sample: Sample) -> list[bytes]:
        fields = sample.fields
        if KEY in fields:
            raise RecordError(f"a field is named {KEY!r}, the column of the sample's key in MDS")
        columns = [(KEY, "str", sample.key.encode("utf-8"))]
        for name, value in fields.items():
            encoding, data = encode_value(value)
            columns.append((name, encoding, data))
        if self.images and encoding_of(fields.get("ext")) is not None:
            columns = [(n, encoding_of(fields["ext"]) if n == "image" else e, d)  # type: ignore[misc]
                       for n, e, d in columns]
        columns.sort(key=lambda c: c[0])
        for name, encoding, data in columns:
            size = column_size(encoding)
            if (size is None and len(data) >= 1 << 32) or not name:
                raise RecordError(f"field {name!r} cannot be an MDS column ({len(data)} bytes)")
        return frame(columns)

    def schema(self, fields: dict[str, Any], *, text_from: str | None) -> dict[str, Any]:
        """The columns: the key, then the fields as the source describes them (the text is one)."""
        return {KEY: {"kind": "str"}, **fields}


def encoding_of(ext: Any) -> str | None:
    """The MDS image encoding of a file extension (None: kept as ``bytes``)."""
    return IMAGE_ENCODINGS.get(ext.lower()) if isinstance(ext, str) else None
