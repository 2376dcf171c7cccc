"""A split's Lance table: the manifest, transaction and version hint that make its shards' data
files one dataset (``lance.dataset(OUT / "train.lance")``), the same bytes for the same shards.

pylance commits it (``LanceDataset.commit`` of an ``Overwrite`` listing one fragment per shard, in
order, so that row ``i`` of the dataset is sample ``i`` of the split) into a temporary folder, and
the files are moved into the dataset's: a table over data files it never reads (their paths are
relative to the dataset). Two things in what pylance writes would change from run to run: the
transaction's UUID, which it takes from us (a UUID5 of the shards' digests), and the manifest's
timestamp, which it takes from the clock, with no option to set it (the Rust
``ManifestWriteConfig.timestamp`` is not exposed). So the manifest's timestamp field is rewritten
to the epoch (``fixed_timestamp``): the manifest file is ``[u32 n][transaction][u32 n][Manifest]``
then a 16-byte footer (``<u64 position of the Manifest><u16 major><u16 minor>LANC``), the Manifest a
protobuf message whose field 7 is a ``google.protobuf.Timestamp`` (Lance's ``table.proto``); the
field is replaced, the length and nothing else follows. What pylance reads back is checked: the
version's timestamp is the epoch, the rows are the shards'. A rerun (resume) commits again: the
same bytes. The shards' own schemas are joined into the dataset's (``schema.py``)."""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from pathlib import Path
from typing import Any

from shardsmith.errors import ShardsmithError
from shardsmith.formats.lance.names import dataset_dir, hashed, quiet_lance
from shardsmith.formats.lance.schema import joined, placed
from shardsmith.kit.sample import KEY

EMPTY = (KEY, "string")  # an empty split's one column: the key every row has
_FOOTER = struct.Struct("<QHH4s")
_MAGIC = b"LANC"
_TIMESTAMP = 7  # Manifest.timestamp in Lance's table.proto


def commit_table(out_dir: Path, split: str, shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Commit the table of ``shards`` (their records, in order) as the split's dataset; the records
    (path, bytes, sha256) of the files the table adds, relative to ``out_dir``."""
    quiet_lance()
    import lance
    import pyarrow as pa
    from lance.fragment import DataFile, FragmentMetadata

    root = out_dir / dataset_dir(split)
    root.mkdir(parents=True, exist_ok=True)
    for stale in (*root.glob(".*.tmp-*"), root / "_versions", root / "_transactions"):
        shutil.rmtree(stale, ignore_errors=True)  # a killed run's, or this table committed before (resume)
    schemas = _schemas(root, shards)
    schema = joined(schemas, [s["path"] for s in shards]) if shards else pa.schema([EMPTY])
    fragments = []
    for k, (shard, own) in enumerate(zip(shards, schemas)):
        major, minor = (int(x) for x in str(shard["file_version"]).split("."))
        fields, columns = placed(shard["columns"], own, schema, shard=shard["path"])
        data = DataFile(_file_name(shard), fields, columns, major, minor, int(shard["bytes"]))
        fragments.append(FragmentMetadata(id=k, files=[data], physical_rows=int(shard["samples"])))
    tag = uuid.uuid5(uuid.NAMESPACE_URL, "shardsmith-lance:" + ",".join(s["sha256"] for s in shards))
    tmp = root / f".table.tmp-{os.getpid()}"
    try:
        op = lance.LanceOperation.Overwrite(schema, fragments)
        lance.LanceDataset.commit(str(tmp), lance.Transaction(read_version=0, operation=op, uuid=str(tag)))
        files = sorted(p.relative_to(tmp).as_posix() for sub in ("_versions", "_transactions")
                       for p in (tmp / sub).rglob("*") if p.is_file())
        for rel in files:
            if rel.endswith(".manifest"):
                fixed_timestamp(tmp / rel)
        for sub in ("_versions", "_transactions"):
            if (tmp / sub).exists():
                os.replace(tmp / sub, root / sub)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _check(root, shards)
    base = dataset_dir(split)
    return [dict(zip(("path", "bytes", "sha256"), (f"{base}/{rel}", *hashed(root / rel)))) for rel in files]


def _file_name(shard: dict[str, Any]) -> str:
    return str(shard["path"]).rsplit("/", 1)[-1]


def _schemas(root: Path, shards: list[dict[str, Any]]) -> list[Any]:
    """Each shard file's own schema (its footer)."""
    from lance.file import LanceFileReader

    return [LanceFileReader(str(root / "data" / _file_name(s))).metadata().schema for s in shards]


def _check(root: Path, shards: list[dict[str, Any]]) -> None:
    """What pylance reads of the table: as many rows as the shards, the version's time the epoch."""
    import lance

    try:
        ds = lance.dataset(str(root))
        rows, stamp = ds.count_rows(), ds.versions()[-1]["timestamp"]
    except Exception as exc:  # pylance's errors for a table it cannot read
        raise ShardsmithError(f"--to lance: {root}: pylance cannot read the table written ({exc})") from None
    expected = sum(int(s["samples"]) for s in shards)
    if rows != expected or stamp.timestamp() > 86400:  # a naive local datetime of the epoch
        raise ShardsmithError(f"--to lance: {root}: pylance reads {rows} rows at {stamp}, not {expected} rows "
                              f"at the epoch: this pylance ({lance.__version__}) writes manifests unlike the ones "
                              f"shardsmith knows")


def fixed_timestamp(path: Path) -> None:
    """Rewrite the manifest at ``path`` with its timestamp the epoch (the module says how)."""
    data = path.read_bytes()
    if len(data) < _FOOTER.size:
        raise ShardsmithError(f"--to lance: {path}: not a Lance manifest (too short)")
    pos, major, minor, magic = _FOOTER.unpack_from(data, len(data) - _FOOTER.size)
    if magic != _MAGIC or pos + 4 > len(data) - _FOOTER.size:
        raise ShardsmithError(f"--to lance: {path}: not a Lance manifest (no footer)")
    (n,) = struct.unpack_from("<I", data, pos)
    if pos + 4 + n != len(data) - _FOOTER.size:
        raise ShardsmithError(f"--to lance: {path}: a Lance manifest laid out unlike the ones shardsmith knows")
    message = data[pos + 4:pos + 4 + n]
    out = bytearray()
    seen = 0
    for number, start, end in _fields(message):
        if number == _TIMESTAMP:
            out += bytes([(_TIMESTAMP << 3) | 2, 0])  # an empty Timestamp: 0 seconds, 0 nanos
            seen += 1
        else:
            out += message[start:end]
    if seen != 1:
        raise ShardsmithError(f"--to lance: {path}: a Lance manifest with {seen} timestamps")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data[:pos] + struct.pack("<I", len(out)) + bytes(out) + data[len(data) - _FOOTER.size:])
    os.replace(tmp, path)


def _varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(b):
            raise ShardsmithError("--to lance: a Lance manifest cut short")
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def _fields(message: bytes) -> Any:
    """The top-level fields of a protobuf message: (number, start, end) of each, in order."""
    i = 0
    while i < len(message):
        start = i
        key, i = _varint(message, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(message, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = _varint(message, i)
            i += n
        else:
            raise ShardsmithError(f"--to lance: a Lance manifest with a protobuf field of wire type {wire}")
        yield key >> 3, start, i
