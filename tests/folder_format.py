"""A format plugin that writes each shard as a folder of its own (``{split}-000000.dir/`` holding
``samples.bin`` and ``lengths.json``): the shape of outputs such as Lance's or MDS's, which core, kit
and the engine must handle by what the format declares (``Format.own_files``, the shard record's
companions), never by its file names. Registered by the tests that use it (``registered``), as
its entry point would register it; written against ``shardsmith.plugin`` only, as a third party would.

It gives no encoder of its own (``Format.encoder``), so a sample is stored as the neutral encoding
every such format is handed (``kit/sample.py``), unchanged; the dataset gives it back decoded
(``Sample.decode``) as ``{"__key__": key, field: typed value, ...}``: a new format never parses
webdataset's tar members.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardsmith.kit.options import SHARD_SAMPLES, FormatOptions
from shardsmith.plugin import (
    SHARD_NAMES,
    Dataset,
    Folder,
    Format,
    ListForm,
    OwnFiles,
    Sample,
    SampleKind,
    ShardRange,
    ShardRecord,
    WriteJob,
    Writer,
)

NAME = "folders"
SUFFIX = ".dir"
SAMPLES, LENGTHS = "samples.bin", "lengths.json"
OPTIONS = FormatOptions(to=NAME, options=(SHARD_SAMPLES,))
_UNLIMITED = 1 << 62


class FolderFormat(Format):
    """Rows, each shard a folder of two files."""

    name = NAME
    manifest_format = NAME
    option = NAME
    options = OPTIONS
    accepts = ("rows",)
    sample_unit = "row"
    # a shard's folder, all of it: what --overwrite removes and an S3 output publishes
    own_files = OwnFiles(folders=(Folder(SHARD_NAMES.removesuffix(".*") + SUFFIX),))

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        return FolderWriter(out_dir=job.out, split=split, shard_samples=job.options.shard_samples, part=part)

    def validate(self, manifest: dict[str, Any], bad: Any) -> None:
        for name, split in manifest["splits"].items():
            for shard in split["shards"]:
                if not isinstance(shard.get("lengths"), dict):
                    raise bad(f"shard {shard['path']!r} of split {name!r} names no {LENGTHS}")

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> FolderDataset:
        return FolderDataset(out_dir, split=split)

    def verify_deep(self, out: Any, manifest: dict[str, Any], split: str) -> list[str]:
        ds = self.open(out, split=split)
        return [f"split {split}: sample {i} has no key" for i in range(len(ds)) if not ds[i]["__key__"]]

    def show_one(self, sample: Any) -> dict[str, Any]:
        return {"key": sample["__key__"], "members": {k: len(v) for k, v in sample.items() if k != "__key__"}}


class FolderWriter(Writer):
    """Rolls over every ``shard_samples`` rows; each shard is built in a temporary folder, renamed
    into place whole (a shard a killed run left half-made is never under its name)."""

    name = NAME

    def __init__(self, *, out_dir: Path, split: str, shard_samples: int | None, part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.shard_samples = shard_samples
        self._roller = self.rollover()
        self._samples: list[bytes] = []

    def rollover(self) -> Any:
        from shardsmith.kit.rollover import Rollover

        return Rollover(max_weight=_UNLIMITED, max_samples=self.shard_samples)

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        starts = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
        cuts = set(self._roller.cut(np.asarray(lengths, dtype=np.int64)))
        for i in range(len(lengths)):
            if i in cuts:
                self._flush()
            self._samples.append(bytes(payload[int(starts[i]):int(starts[i + 1])]))

    def shard_full(self) -> None:
        self._flush()
        self._roller = self.rollover()

    def _flush(self) -> None:
        if not self._samples:
            return
        name = self.shard_name(self.next_index(), SUFFIX)
        data = b"".join(self._samples)
        index = json.dumps({"lengths": [len(s) for s in self._samples]}).encode()
        tmp = self.out_dir / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for file, content in ((SAMPLES, data), (LENGTHS, index)):
            with open(tmp / file, "wb") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
        final = self.out_dir / name
        if final.exists():  # left by a run killed after it renamed the shard, before it recorded it
            shutil.rmtree(final)
        os.replace(tmp, final)
        lengths = {"path": f"{name}/{LENGTHS}", "bytes": len(index), "sha256": hashlib.sha256(index).hexdigest()}
        self.shards.append(ShardRecord(path=f"{name}/{SAMPLES}", samples=len(self._samples), bytes=len(data),
                                       sha256=hashlib.sha256(data).hexdigest(), extra={"lengths": lengths}))
        self.md5s.append(None)
        self._samples = []

    def close(self) -> list[ShardRecord]:
        self._flush()
        return self.shards

    def abort(self) -> None:
        self._samples = []


class FolderDataset(Dataset):
    """A split's rows, read whole on open: ``len``, ``ds[i]`` and ``read``, the loader's protocol
    (``iter``, the adapters and mixtures come with it)."""

    kind = SampleKind("folder rows", ListForm())

    def __init__(self, out_dir: Any, *, split: str) -> None:
        from shardsmith.kit.dataset_files import files_for

        files = files_for(out_dir)
        _, shards = files.load_split(fmt=NAME, split=split)
        self.rows: list[dict[str, Any]] = []
        for shard in shards:
            data = files.sidecar(shard)
            pos = 0
            for n in json.loads(files.sidecar(shard["lengths"]))["lengths"]:
                self.rows.append(_members(data[pos:pos + n]))
                pos += n

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def read(self, indices: Any) -> list[dict[str, Any]]:
        return [self.rows[int(i)] for i in np.asarray(indices).reshape(-1)]


def _members(data: bytes) -> dict[str, Any]:
    """A stored sample, decoded: its key, then its fields as the source typed them."""
    sample = Sample.decode(data)
    return {"__key__": sample.key, **sample.fields}


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """This format registered as its entry point would register it (``shardsmith.formats``), beside
    whatever else is installed, in this process and in the children it forks."""
    from shardsmith import registry

    here = str(Path(__file__).resolve().parent)
    plugin = registry.Plugin("format", NAME, f"{__name__}:FolderFormat", origin="shardsmith-folders")
    installed = registry._installed()
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(here)
        mp.setattr(registry, "_installed", lambda: (*installed, plugin))
        yield
