"""One MDS shard's bytes, and a split's ``index.json``, as mosaicml-streaming reads them.

A shard file (``shard.{00000}.mds``, version 2)::

    uint32 n                      samples in the shard
    uint32 offsets[n + 1]         where each sample's bytes start in the file (the last: the end)
    config                        JSON (sorted keys) of the shard's columns and settings
    samples                       each: the variable columns' uint32 sizes, then the columns' bytes

and ``index.json`` lists the shards, each with its config, sample count and file (``raw_data``):
``StreamingDataset`` reads the index, then the samples by the offsets. Offsets are 32-bit, so a
shard stays under 4 GiB (``MdsFormat.check`` bounds ``--shard-bytes``).

The columns of a shard are those of its samples (``encoding.py``). Samples made from the same
fields share them, and their bodies are written as they came from the workers. Where they
differ (a JSON row without a key another has, a value null in one row and a number in
another) the shard's columns are reconciled from its samples alone, so the bytes depend on the
samples only: every name any sample has; a column whose samples agree keeps its encoding, image
bytes of several extensions become ``bytes``, arrays of one dtype and several shapes (token ids
of documents of several lengths) ``ndarray:{dtype}``, each sample's array with its shape, and any
other mix becomes ``json`` (a missing value: null). Bytes mixed with other values cannot be one MDS column: refused in one line.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson

from shardsmith.errors import DataError
from shardsmith.formats.mds.encoding import (
    BINARY,
    HEAD,
    column_size,
    decode_value,
    ndarray_of,
    sample_body,
    shape_prefix,
    to_json,
)

VERSION = 2
INDEX = "index.json"
_U32 = struct.Struct("<I")
_CHECKED = 8192  # samples whose headers are compared at once
Columns = tuple[tuple[str, str], ...]  # (name, encoding) in the shard's order


def shard_basename(index: int) -> str:
    """A shard's file name, as ``streaming.MDSWriter`` names its shards."""
    return f"shard.{index:05d}.mds"


def config(columns: Columns, size_limit: int) -> dict[str, Any]:
    """The config a shard's header and its index entry hold."""
    return {"column_encodings": [e for _, e in columns], "column_names": [n for n, _ in columns],
            "column_sizes": [column_size(e) for _, e in columns], "compression": None, "format": "mds",
            "hashes": [], "size_limit": size_limit, "version": VERSION}


def split_payload(payload: bytes | memoryview) -> tuple[bytes, memoryview]:
    """A worker's payload as (header bytes, body)."""
    view = memoryview(payload)
    (size,) = HEAD.unpack_from(view, 0)
    return bytes(view[HEAD.size:HEAD.size + size]), view[HEAD.size + size:]


def build_shard(data: bytes, lengths: np.ndarray, *, size_limit: int, where: str) -> tuple[Columns, list[bytes]]:
    """The shard file of samples (the workers' payloads back to back in ``data``, of ``lengths``,
    in order) as buffers, and its columns. Samples of one header (the common case, checked with
    numpy) are written as their bodies, the others recoded one by one."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths
    arr = np.frombuffer(data, dtype=np.uint8)
    shared = _shared_header(arr, starts, lengths)
    if shared is not None:
        header, cut = shared
        columns = tuple((n, e) for n, e in orjson.loads(header))
        view = memoryview(data)
        body = b"".join([view[a + cut:a + n] for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)])
        sizes = lengths - cut
    else:
        columns, body, sizes = _mixed(data, starts, lengths, where)
    head = json.dumps(config(columns, size_limit), sort_keys=True).encode("utf-8")
    n = len(sizes)
    first = 4 + 4 * (n + 1) + len(head)
    if first + len(body) >= 1 << 32:
        raise DataError(file=where, reason="an MDS shard holds at most 4 GiB: lower --shard-bytes")
    offsets = np.concatenate([[0], np.cumsum(sizes)]) + first
    return columns, [_U32.pack(n), offsets.astype("<u4").tobytes(), head, body]


def _shared_header(arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[bytes, int] | None:
    """The header every sample has (and the bytes it takes with its size), or None when they differ."""
    if not len(starts):
        return None
    (size,) = HEAD.unpack_from(arr, 0)
    cut = HEAD.size + size
    if np.any(lengths < cut):
        return None
    first = arr[:cut]
    for at in range(0, len(starts), _CHECKED):  # (a bounded matrix of headers at a time)
        heads = arr[starts[at:at + _CHECKED, None] + np.arange(cut)]
        if not np.array_equal(heads, np.broadcast_to(first, heads.shape)):
            return None
    return first[HEAD.size:].tobytes(), cut


def _mixed(data: bytes, starts: np.ndarray, lengths: np.ndarray, where: str) -> tuple[Columns, bytes, np.ndarray]:
    """Samples of several headers: their columns reconciled, each body recoded into them."""
    headers: dict[bytes, Columns] = {}
    parts = []
    for a, n in zip(starts.tolist(), lengths.tolist(), strict=True):
        header, body = split_payload(memoryview(data)[a:a + n])
        if header not in headers:
            headers[header] = tuple((name, e) for name, e in orjson.loads(header))
        parts.append((headers[header], body))
    if len(headers) == 1:
        columns = next(iter(headers.values()))
        bodies = [bytes(body) for _, body in parts]
    else:
        columns = _reconciled(list(headers.values()), where)
        bodies = [b"".join(_recoded(cols, body, columns)) for cols, body in parts]
    return columns, b"".join(bodies), np.array([len(b) for b in bodies], dtype=np.int64)


def index_json(entries: list[dict[str, Any]]) -> bytes:
    """A split's ``index.json`` of its shards' entries (``index_entry``), as MDSWriter writes it."""
    return json.dumps({"shards": entries, "version": VERSION}, sort_keys=True).encode("utf-8")


def index_entry(*, basename: str, samples: int, nbytes: int, columns: Columns, size_limit: int) -> dict[str, Any]:
    """One shard in ``index.json``: its config, samples and file (no hashes, no compression)."""
    return {**config(columns, size_limit), "raw_data": {"basename": basename, "bytes": nbytes, "hashes": {}},
            "samples": samples, "zip_data": None}


def _reconciled(schemas: list[Columns], where: str) -> Columns:
    """The columns of samples whose columns differ (the module docstring's rules)."""
    names = sorted({n for cols in schemas for n, _ in cols})
    out = []
    for name in names:
        kinds = {dict(cols).get(name) for cols in schemas}
        if len(kinds) == 1:
            out.append((name, next(iter(kinds))))
        elif None not in kinds and kinds <= BINARY:
            out.append((name, "bytes"))
        elif (dynamic := _one_dtype(kinds)) is not None:
            out.append((name, dynamic))
        elif kinds & BINARY:
            raise DataError(file=where, reason=f"field {name!r} is bytes in some records and "
                                               f"{'missing' if None in kinds else 'not bytes'} in others: an MDS "
                                               "column holds one type")
        else:
            out.append((name, "json"))
    return tuple(out)


def _one_dtype(kinds: set[str | None]) -> str | None:
    """``ndarray:{dtype}`` (the shape in each sample) when every sample has an array of one dtype, else None."""
    arrays = [ndarray_of(k) if k is not None else None for k in kinds]
    dtypes = {a[0].name for a in arrays if a is not None}
    return f"ndarray:{dtypes.pop()}" if None not in arrays and len(dtypes) == 1 else None


def column_values(columns: Columns, body: bytes | memoryview) -> list[bytes]:
    """A sample body's columns' bytes, in the columns' order."""
    view = memoryview(body)
    variable = sum(column_size(e) is None for _, e in columns)
    sizes = iter(struct.unpack_from(f"<{variable}I", view, 0))
    at, out = 4 * variable, []
    for _, encoding in columns:
        size = column_size(encoding)
        size = next(sizes) if size is None else size
        out.append(bytes(view[at:at + size]))
        at += size
    return out


def _recoded(columns: Columns, body: bytes | memoryview, target: Columns) -> list[bytes]:
    """A sample's body in the reconciled columns ``target``."""
    have = {name: (encoding, data) for (name, encoding), data in zip(columns, column_values(columns, body), strict=True)}
    out = []
    for name, encoding in target:
        if name not in have:
            out.append((name, encoding, b"null"))
            continue
        was, data = have[name]
        if was == encoding or encoding == "bytes":
            out.append((name, encoding, data))
        elif (array := ndarray_of(encoding)) is not None and array[1] is None:  # (was: a shape of its own)
            out.append((name, encoding, shape_prefix(_shape_of(was)) + data))
        else:
            out.append((name, encoding, _as_json(was, data)))
    return sample_body(out)


def _shape_of(encoding: str) -> list[int]:
    array = ndarray_of(encoding)
    assert array is not None and array[1] is not None, encoding
    return array[1]


def _as_json(encoding: str, data: bytes) -> bytes:
    """A value of one encoding as a ``json`` column holds it."""
    if encoding == "json" or encoding in BINARY:
        return data  # (json already; bytes never meet other values in one column: refused before)
    return to_json(decode_value(encoding, data))
