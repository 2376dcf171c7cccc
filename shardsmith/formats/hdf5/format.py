"""HDF5 event shards as a registered format: one group per field, ragged fields as values plus
offsets shared by the fields of one counter, optionally compressed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as m_
from shardsmith.core.own_files import OwnFiles
from shardsmith.errors import DatasetError
from shardsmith.formats.hdf5.options import OPTIONS
from shardsmith.kit.format import CardData, Format, Rate, WriteJob, timed_batches
from shardsmith.kit.writer import SHARD_NAMES, ShardRange, Writer


class HDF5Format(Format):
    name = "hdf5"
    manifest_format = "hdf5"
    option = OPTIONS.to
    options = OPTIONS
    accepts = ("events",)
    sample_unit = "event"
    own_files = OwnFiles(files=(SHARD_NAMES,))  # {split}-{000000}.h5

    def validate(self, m: dict[str, Any], bad: Any) -> None:
        """The manifest fields this format's readers read, each typed (``core.manifest.check``)."""
        events = m_.need(m, "events", dict, bad, optional=True)
        counters = m_.need(events or {}, "counters", list, bad, where="events.", optional=True)
        if counters is not None and not all(isinstance(c, str) for c in counters):
            raise bad("'events.counters' must be a list of names")
        m_.check_events_schema(m, bad)

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.hdf5.writer import HDF5Writer

        o = job.options
        return HDF5Writer(out_dir=job.out, split=split, schema=job.schema, shard_samples=o.shard_samples,
                          shard_bytes=o.shard_bytes, compression=o.compression, part=part)

    def manifest_fields(self, job: WriteJob, outputs: dict[str, Any]) -> dict[str, Any]:
        return {"hdf5": {"compression": job.options.compression}}

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        """``datasets``' ``hdf5`` builder reads the fixed-shape fields (``formats/hdf5/card.py``)."""
        from shardsmith.formats.hdf5.card import hdf5_card

        return hdf5_card(manifest)

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        from shardsmith.formats.hdf5.dataset import EventDataset

        return EventDataset(out_dir, split=split)

    def verify_deep(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """Every shard opened (schema, offsets monotonic from 0 to len(values)) and every value read."""
        problems: list[str] = []
        try:
            ds = self.open(out, split=split)
            for a in range(0, len(ds), 4096):
                ds.get_batch(np.arange(a, min(a + 4096, len(ds))))  # decompresses every chunk
        except DatasetError as exc:
            problems.append(str(exc))
        except Exception as exc:  # h5py's errors for damaged chunks and headers
            where = getattr(out, "where", out)  # a folder, or the files of a dataset at a URL
            problems.append(f"{where} [{split}]: cannot read the events ({type(exc).__name__}: {exc})")
        return problems

    def report(self, out: Path, manifest: dict[str, Any], sampling: Any) -> list[Any]:
        """Values per event, a histogram per field (NaN and infinities counted), label balance."""
        from shardsmith.formats.hdf5.report import hdf5_sections

        return hdf5_sections(out, manifest, sampling)

    def show_one(self, sample: Any) -> dict[str, Any]:
        """An event: each field's shape and first values."""
        return {"fields": {k: {"shape": list(v.shape), "first": v.reshape(-1)[:3].tolist()}
                           for k, v in list(sample.items())[:12]}}

    def bench(self, out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float) -> Rate:
        """Block-shuffled batches of events (the loader's default): events/s and MB/s of decoded arrays."""
        return timed_batches(self.open(out, split=split), out=out, split=split, batch_size=batch_size,
                             seconds=seconds, how="block shuffle", measure=lambda batch: (
                                 batch.n, sum(a.nbytes for a in batch.fixed.values())
                                 + sum(r.values.nbytes for r in batch.ragged.values())))
