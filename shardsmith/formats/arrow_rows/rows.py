"""The encoding of a sample for the formats that store rows as typed columns (``Format.encoder`` of
parquet and lance), made to be read back many at once.

A sample is ``<u32 n>`` then ``n`` bytes of JSON, ``[key, order, plain, blobs]``, then the blobs' bytes:
``plain`` the fields JSON holds (by name), ``blobs`` the others as ``[name, "bytes", [size]]`` or
``[name, "array", [dtype, shape, size]]`` in the order their bytes follow, ``order`` the field names
in the sample's order when it has blobs (null otherwise: ``plain``'s order is the sample's). The
writer joins a row group's JSON heads into one JSON array and parses it in one call
(``decode_rows``): about four times faster than reading each neutral sample (``Sample.decode``)
on its own, which is most of what writing a row group costs."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from shardsmith.kit.sample import FileBytes, RecordError, Sample, SampleEncoder

KEY = "__key__"  # the sample's key, a column of its own (as webdataset's loaders name it)
_HEAD = struct.Struct("<I")
_JSON = orjson.OPT_SERIALIZE_NUMPY


class RowEncoder(SampleEncoder):
    """A sample as the module says; a field named ``__key__`` is a bad record (the key's column)."""

    def encode(self, sample: Sample) -> list[bytes]:
        plain: dict[str, Any] = {}
        blobs: list[list[Any]] = []
        data: list[bytes] = []
        for name, value in sample.fields.items():
            if name == KEY:
                raise RecordError(f"a field is named {KEY}, the column of the sample's key in Parquet: rename it "
                                  f"(--transform select=...)")
            if isinstance(value, FileBytes):
                value = value.data
            if isinstance(value, bytes | bytearray | memoryview):
                data.append(bytes(value))
                blobs.append([name, "bytes", [len(data[-1])]])
            elif isinstance(value, np.ndarray):
                array = np.ascontiguousarray(value)
                data.append(array.tobytes())
                blobs.append([name, "array", [array.dtype.str, list(array.shape), len(data[-1])]])
            else:
                plain[name] = value
        order = list(sample.fields) if blobs else None
        try:  # a value JSON cannot hold (a date, a decimal) is given as its str
            head = orjson.dumps([sample.key, order, plain, blobs], default=str, option=_JSON)
        except orjson.JSONEncodeError as exc:
            raise RecordError(f"the record cannot be written ({exc})") from None
        return [_HEAD.pack(len(head)), head, *data]

    def schema(self, fields: dict[str, Any], *, text_from: str | None) -> dict[str, Any]:
        """The columns: the key, then the fields as described (the text is the column it came from)."""
        return {KEY: {"kind": "text"}, **fields}


def decode_rows(samples: list[bytes]) -> tuple[list[str], list[dict[str, Any]]]:
    """The keys and the fields of encoded samples, in order (the JSON heads parsed in one call)."""
    sizes = [_HEAD.unpack_from(s)[0] for s in samples]
    heads = orjson.loads(b"[" + b",".join([memoryview(s)[4:4 + n] for s, n in zip(samples, sizes)]) + b"]")
    keys = [h[0] for h in heads]
    rows = [h[2] for h in heads]
    for k, head in enumerate(heads):
        if not head[3]:
            continue
        data, pos, row = samples[k], 4 + sizes[k], rows[k]
        for name, kind, meta in head[3]:
            nbytes = meta[0] if kind == "bytes" else meta[2]
            blob = data[pos:pos + nbytes]
            pos += nbytes
            row[name] = blob if kind == "bytes" else np.frombuffer(blob, dtype=meta[0]).reshape(meta[1])
        rows[k] = {name: row[name] for name in head[1]}
    return keys, rows
