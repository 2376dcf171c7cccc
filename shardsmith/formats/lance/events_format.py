"""Physics events as Lance datasets (``convert --from root|parquet-events --to lance``): the Lance
format (``format.py``: one dataset per split, one data file per shard, the same table, checks and
reader), whose writer takes event records (``events.py``: each event one row, its scalar fields
typed columns, its jagged fields list columns). Registered beside the Lance format of rows and
images, as event tar shards are beside webdataset's: ``--to lance`` picks it for events; a manifest
with ``events`` is read by it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.core import manifest as m_
from shardsmith.errors import UsageError
from shardsmith.formats.lance.format import LanceFormat
from shardsmith.kit.event_codec import EventEncoder, NeutralEventEncoder
from shardsmith.kit.format import CardData, WriteJob
from shardsmith.kit.sample import KEY
from shardsmith.kit.writer import ShardRange, Writer

NOTE = ("Each row is one event: its scalar fields typed columns, its jagged fields list columns (one list per "
        "event); `__key__` is the event's place in the split (`e0000000000` on).")


class LanceEventsFormat(LanceFormat):
    name = "lance-events"
    accepts = ("events",)

    def check(self, job: WriteJob) -> None:
        if any(f.name == KEY for f in job.schema.fields):
            raise UsageError(f"a field is named {KEY}, the column of each event's place in Lance: leave it out "
                             f"with --branches")

    def encoder(self, job: WriteJob, kind: str) -> EventEncoder:
        """The neutral event records (``core.events``), which its writer decodes into a group's columns;
        not the typed samples of the rows' Lance format it extends."""
        return NeutralEventEncoder()

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.lance.events import LanceEventWriter

        o = job.options
        return LanceEventWriter(out_dir=job.out, split=split, schema=job.schema, shard_samples=o.shard_samples,
                                shard_bytes=o.shard_bytes, part=part)

    def reads(self, manifest: dict[str, Any]) -> bool:
        return manifest.get("format") == self.manifest_format and "events" in manifest

    def validate(self, manifest: dict[str, Any], bad: Any) -> None:
        super().validate(manifest, bad)
        m_.need(manifest, "events", dict, bad)
        m_.check_events_schema(manifest, bad)

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        card = super().card(out, manifest)
        return CardData(notes=(*card.notes, NOTE), unreadable=card.unreadable)
