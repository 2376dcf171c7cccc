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
  ``ndarray:{dtype}`` (no shape): each sample's array carries its own shape first (``streaming``'s
  dynamic shape), what a shard's column becomes when its samples' arrays differ in shape (a
  document's token ids: ``shard.py``);
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

import json
import struct
from typing import Any

import numpy as np
import orjson

from shardsmith.kit.sample import KEY, FileBytes, RecordError, Sample, SampleEncoder

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


def ndarray_of(encoding: str) -> tuple[np.dtype, list[int] | None] | None:
    """An ``ndarray:{dtype}[:{shape}]`` encoding's little-endian dtype and shape (None: each sample
    carries its shape); None for another encoding."""
    if not encoding.startswith("ndarray:"):
        return None
    _, dtype, *shape = encoding.split(":")
    return np.dtype(dtype).newbyteorder("<"), ([int(s) for s in shape[0].split(",")] if shape else None)


def column_size(encoding: str) -> int | None:
    """A column's fixed size in bytes (``column_sizes`` in the shard's header), None when variable."""
    array = ndarray_of(encoding)
    if array is not None:
        return None if array[1] is None else int(np.prod(array[1])) * array[0].itemsize
    return FIXED.get(encoding)


def shape_prefix(shape: list[int]) -> bytes:
    """What a dynamic-shape ``ndarray:{dtype}`` value starts with, as ``streaming``'s NDArray writes
    it: a byte of ``ndim << 2 | k`` (the shape's dtype: uint8/16/32/64 for k 0-3), then the shape."""
    big = max(shape)
    k = 0 if big < 1 << 8 else 1 if big < 1 << 16 else 2 if big < 1 << 32 else 3
    return bytes([len(shape) << 2 | k]) + np.asarray(shape, dtype=f"<u{1 << k}").tobytes()


def _dynamic_array(dtype: np.dtype, data: bytes) -> np.ndarray:
    """A dynamic-shape ``ndarray:{dtype}`` value back from its bytes (``shape_prefix``, then the values)."""
    ndim, k = data[0] >> 2, data[0] & 3
    shape = np.frombuffer(data, dtype=f"<u{1 << k}", count=ndim, offset=1)
    return np.frombuffer(data, dtype=dtype, offset=1 + ndim * (1 << k)).reshape(shape.tolist())


def decode_value(encoding: str, data: bytes) -> Any:
    """One column's value back from its bytes, as the encoder was given it (images: their file's bytes)."""
    if encoding == "str":
        return data.decode("utf-8")
    if encoding in BINARY:
        return data
    if encoding == "int":
        return _INT64.unpack(data)[0]
    if encoding == "float64":
        return _FLOAT64.unpack(data)[0]
    if encoding == "json":
        return orjson.loads(data)
    array = ndarray_of(encoding)
    if array is not None:
        if array[1] is None:
            return _dynamic_array(array[0], data)
        return np.frombuffer(data, dtype=array[0]).reshape(array[1])
    raise ValueError(f"MDS encoding {encoding!r} is not one shardsmith writes")


def to_json(value: Any) -> bytes:
    """A value as a ``json`` column holds it (a value JSON cannot hold, as its str: as webdataset's
    json). orjson first; what it refuses (an int past 64 bits) the standard library writes."""
    try:
        return orjson.dumps(value, default=str, option=_JSON_OPTIONS)
    except orjson.JSONEncodeError as exc:
        try:
            return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except (ValueError, RecursionError):
            raise RecordError(f"the value cannot be written as JSON ({exc})") from None


def encode_value(value: Any) -> tuple[str, bytes]:
    """One field's (encoding, bytes); the common types first, by their exact type (once per field)."""
    kind = type(value)
    if kind is str:
        return "str", value.encode("utf-8")
    if kind is int and INT64_RANGE[0] <= value <= INT64_RANGE[1]:
        return "int", _INT64.pack(value)
    if kind is float:
        return "float64", _FLOAT64.pack(value)
    if kind is list or kind is dict or value is None:
        return "json", to_json(value)
    if kind is bytes:
        return "bytes", value
    return _encode_other(value)


def _encode_other(value: Any) -> tuple[str, bytes]:
    """``encode_value`` of the other types (and of subclasses of the common ones)."""
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
        little = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"), copy=False)
        return f"ndarray:{value.dtype.name}:{shape}", little.tobytes()
    return "json", to_json(value)


def sample_body(columns: list[tuple[str, str, bytes]]) -> list[bytes]:
    """The MDS sample bytes of columns (name, encoding, bytes) in their order: the variable ones'
    uint32 sizes, then every column's bytes."""
    sizes = [len(data) for _, encoding, data in columns if column_size(encoding) is None]
    return [struct.pack(f"<{len(sizes)}I", *sizes), *(data for _, _, data in columns)]


class MdsEncoder(SampleEncoder):
    """Rows and images into MDS columns (the module docstring has the layout). An image's bytes
    are a ``jpeg`` or ``png`` column by the file's extension (``bytes`` for others).

    What follows from a sample's field names and encodings alone (the columns' order, the header,
    which columns carry a size) is worked out once per such signature (``_Plan``): rows of one
    source share a few, so a row costs its values' encoding and one lookup."""

    def __init__(self, *, images: bool = False) -> None:
        self.images = images
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def encode(self, sample: Sample) -> list[bytes]:
        fields = sample.fields
        typed = [encode_value(v) for v in fields.values()]
        encodings = [e for e, _ in typed]
        if self.images and (image := encoding_of(fields.get("ext"))) is not None and "image" in fields:
            encodings[list(fields).index("image")] = image
        signature = (*fields, *encodings)
        plan = self._plans.get(signature)
        if plan is None:
            if len(self._plans) > 4096:  # a source whose every row differs: bounded memory
                self._plans.clear()
            plan = self._plans[signature] = _Plan(list(fields), encodings)
        data = [sample.key.encode("utf-8"), *(d for _, d in typed)]
        ordered = [data[i] for i in plan.order]
        try:
            sizes = plan.sizes.pack(*[len(ordered[i]) for i in plan.variable])
        except struct.error:
            raise RecordError("a value of 4 GiB or more cannot be an MDS column") from None
        return [plan.prefix, sizes, *ordered]

    def schema(self, fields: dict[str, Any], *, text_from: str | None) -> dict[str, Any]:
        """The columns: the key, then the fields as the source describes them (the text is one)."""
        return {KEY: {"kind": "str"}, **fields}


class _Plan:
    """The columns of samples of one signature: their order (the key first among the fields, by
    name), the payload's header, and which columns carry a size."""

    def __init__(self, names: list[str], encodings: list[str]) -> None:
        if KEY in names:
            raise RecordError(f"a field is named {KEY!r}, the column of the sample's key in MDS")
        if "" in names:
            raise RecordError("a field with an empty name cannot be an MDS column")
        columns = [(KEY, "str"), *zip(names, encodings, strict=True)]
        self.order = sorted(range(len(columns)), key=lambda i: columns[i][0])
        ordered = [columns[i] for i in self.order]
        self.variable = [j for j, (_, e) in enumerate(ordered) if column_size(e) is None]
        self.sizes = struct.Struct(f"<{len(self.variable)}I")
        header = orjson.dumps([[n, e] for n, e in ordered])
        self.prefix = HEAD.pack(len(header)) + header


def encoding_of(ext: Any) -> str | None:
    """The MDS image encoding of a file extension (None: kept as ``bytes``)."""
    return IMAGE_ENCODINGS.get(ext.lower()) if isinstance(ext, str) else None
