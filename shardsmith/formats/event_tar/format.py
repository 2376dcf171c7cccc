"""Events in WebDataset tar shards as a registered format: one ``.npy`` member per field, ``N``
events per sample with ``{counter}.offsets`` members cutting the ragged fields into events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.core import manifest as m_
from shardsmith.errors import DatasetError, UsageError
from shardsmith.formats.event_tar.options import OPTIONS
from shardsmith.formats.webdataset.format import WebDatasetFormat, timed_samples
from shardsmith.formats.webdataset.names import OWN_FILES, wids_files, wids_name
from shardsmith.kit.format import CardData, Format, Rate, WriteJob
from shardsmith.kit.writer import ShardRange, Writer

MAX_FIELD_NAME = 84  # a tar member is e0123456789.{field}.npy within ustar's 100 bytes


class EventTarFormat(Format):
    name = "event-tar"
    manifest_format = "webdataset"
    option = OPTIONS.to
    options = OPTIONS
    accepts = ("events",)
    own_files = OWN_FILES  # the tar shards and their indexes, as webdataset's

    def check(self, job: WriteJob) -> None:
        long = [f.name for f in job.schema.fields if len(f.name.encode()) > MAX_FIELD_NAME]
        if long:
            raise UsageError(f"field {long[0]!r} is too long for a tar member name ({MAX_FIELD_NAME} bytes at "
                             f"most); use --to hdf5 or leave it out with --branches")

    def validate(self, m: dict[str, Any], bad: Any) -> None:
        """The manifest fields this format's readers read, each typed (``core.manifest.check``)."""
        WebDatasetFormat().validate(m, bad)
        events = m_.need(m, "events", dict, bad)
        n = m_.count(events, "events_per_sample", bad, where="events.", optional=True, low=1)
        counters = m_.need(events, "counters", list, bad, where="events.", optional=True)
        if counters is not None and not all(isinstance(c, str) for c in counters):
            raise bad("'events.counters' must be a list of names")
        if n is not None and n >= 1 << 31:
            raise bad(f"'events.events_per_sample' is {n}, more than 2**31 - 1")
        m_.check_events_schema(m, bad)

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.event_tar.writer import EventTarWriter

        o = job.options
        return EventTarWriter(out_dir=job.out, split=split, schema=job.schema, events_per_sample=o.events_per_sample,
                              shard_samples=o.shard_samples, shard_bytes=o.shard_bytes, part=part)

    def split_fields(self, job: WriteJob, split: str, output: Any) -> dict[str, Any]:
        return {"wids": wids_name(split)}

    def side_files(self, manifest: dict[str, Any]) -> list[str]:
        return wids_files(manifest)

    def verify_files(self, read: Any, manifest: dict[str, Any], *, failed: set[str]) -> list[str]:
        from shardsmith.formats.webdataset.wids_check import wids_problems

        return wids_problems(read, manifest, failed=failed)

    def manifest_fields(self, job: WriteJob, outputs: dict[str, Any]) -> dict[str, Any]:
        return {"events": {"events_per_sample": job.options.events_per_sample}}

    def reads(self, manifest: dict[str, Any]) -> bool:
        return super().reads(manifest) and "events" in manifest

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        """The ``webdataset`` builder reads the ``.npy`` members as arrays; the events within a sample
        are the user's to cut (or shardsmith's loader's)."""
        from shardsmith.formats.webdataset.card import tar_card

        per = (manifest.get("events") or {}).get("events_per_sample") or 1
        note = (f"Each sample holds up to {per} events, one `.npy` member per field; a ragged field's values "
                f"are cut into events by its counter's `.offsets.npy` member." if per > 1 else
                "Each sample is one event, one `.npy` member per field.")
        return tar_card(out, manifest, notes=(note,))

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        from shardsmith.formats.event_tar.dataset import EventTarDataset

        return EventTarDataset(out_dir, split=split)

    def verify_layout(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """Every shard's offset index as the loader takes it (the tar format's check, on these shards)."""
        return WebDatasetFormat.verify_layout(self, out, manifest, split)  # type: ignore[arg-type]

    def verify_deep(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """Every header read and every sample opened as arrays of the schema's fields."""
        try:
            ds = self.open(out, split=split)
            ds.check_headers()
            for i in range(len(ds)):
                ds[i]
        except DatasetError as exc:
            return [str(exc)]
        return []

    def describe(self, out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        return WebDatasetFormat().describe(out, manifest)

    def report(self, out: Path, manifest: dict[str, Any], sampling: Any) -> list[Any]:
        """The events' sections (as for HDF5), then the tar members'."""
        from shardsmith.formats.event_tar.report import event_tar_sections

        return event_tar_sections(out, manifest, sampling)

    def show(self, out: Path, manifest: dict[str, Any], n: int) -> list[dict[str, Any]]:
        return WebDatasetFormat().show(out, manifest, n)  # the raw members: .npy arrays by dtype and shape

    def bench(self, out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float) -> Rate:
        return timed_samples(self.open(out, split=split), out=out, split=split, seconds=seconds)
