"""Fixed-shape event arrays as a registered format (``convert --to memmap``): per split one
``N x L x F`` float array, the lengths, one N-row array per event-level field, and a JSON that
says how to ``np.memmap`` them (docs/design.md, "On-disk formats")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as m_
from shardsmith.core.own_files import OwnFiles
from shardsmith.core.words import plural
from shardsmith.errors import DatasetError
from shardsmith.formats.memmap.options import OPTIONS
from shardsmith.formats.memmap.shape import ARRAY_SUFFIX, META_SUFFIX, Layout, layout_of
from shardsmith.kit.event_codec import EventEncoder
from shardsmith.kit.format import Format, Rate, WriteJob, timed_batches
from shardsmith.kit.writer import ShardRange, Writer


def job_layout(job: WriteJob) -> Layout:
    o = job.options
    return layout_of(job.schema, max_len=o.max_len, dtype=o.dtype, keep=o.keep)


class MemmapFormat(Format):
    name = "memmap"
    manifest_format = "memmap"
    option = OPTIONS.to
    options = OPTIONS
    accepts = ("events",)
    sample_unit = "event"
    # per split: {split}.values.bin, .lengths.bin, .counts.bin, one .{field}.bin per scalar, and .memmap.json
    own_files = OwnFiles(files=(f"*{ARRAY_SUFFIX}", f"*{META_SUFFIX}"))

    def check(self, job: WriteJob) -> None:
        job_layout(job)

    def encoder(self, job: WriteJob, kind: str) -> EventEncoder:
        """Each event cut to its row in the workers (``encoder.py``): the one writer of a split only copies."""
        from shardsmith.formats.memmap.encoder import MemmapEncoder

        return MemmapEncoder(layout=job_layout(job))

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.memmap.writer import MemmapWriter

        return MemmapWriter(out_dir=job.out, split=split, layout=job_layout(job), part=part)

    def split_fields(self, job: WriteJob, split: str, output: Any) -> dict[str, Any]:
        return {"memmap": output.shards[0].extra["arrays"]["meta"]["path"]} if output.shards else {}

    def manifest_fields(self, job: WriteJob, outputs: dict[str, Any]) -> dict[str, Any]:
        files = []  # every array beside the values, checked by verify like the values themselves
        for o in outputs.values():
            for shard in o.shards:
                arrays = shard.extra["arrays"]
                files += [arrays["meta"], arrays["lengths"], arrays["counts"], *arrays["scalars"].values()]
        return {"memmap": job_layout(job).describe(), "files": files}

    def validate(self, m: dict[str, Any], bad: Any) -> None:
        """The manifest fields the readers read, typed (the JSON is checked against them on open)."""
        mm = m_.need(m, "memmap", dict, bad)
        m_.count(mm, "max_len", bad, where="memmap.", low=1)
        pad = m_.need(mm, "pad_value", (int, float), bad, where="memmap.", optional=True)
        if pad is not None and not math.isfinite(pad):
            raise bad(f"'memmap.pad_value' is {pad}, not a finite number")
        m_.dtype_of(m_.need(mm, "dtype", str, bad, where="memmap."), bad, "'memmap.dtype'")
        for key in ("fields", "scalars"):
            names = m_.need(mm, key, list, bad, where="memmap.")
            if not all(isinstance(x, str) for x in names):
                raise bad(f"'memmap.{key}' must be a list of names")
        m_.check_events_schema(m, bad)
        for name, split in m["splits"].items():
            if len(split["shards"]) > 1:
                raise bad(f"split {name!r}: a memmap split is one array set, the manifest lists "
                          f"{len(split['shards'])}")
            for shard in split["shards"]:
                arrays = m_.need(shard, "arrays", dict, bad, where=f"splits.{name}.shards[].")
                m_.count(shard, "truncated", bad, where=f"splits.{name}.shards[].", optional=True)
                for key in ("meta", "lengths", "counts"):
                    m_.file_entry(arrays.get(key), bad, f"splits.{name}.shards[].arrays.{key}")
                scalars = m_.need(arrays, "scalars", dict, bad, where=f"splits.{name}.shards[].arrays.")
                for field, entry in scalars.items():
                    m_.file_entry(entry, bad, f"splits.{name}.shards[].arrays.scalars.{field}")

    # -- reading ------------------------------------------------------------------------------

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        from shardsmith.formats.memmap.dataset import MemmapDataset

        return MemmapDataset(out_dir, split=split)

    def verify_layout(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """The split's JSON against the manifest and the file sizes (shape x itemsize = bytes)."""
        from shardsmith.formats.memmap.meta import read_meta
        from shardsmith.kit.dataset_files import files_for

        files = files_for(out)  # a folder, or the files of a dataset at a URL (``verify URL``)
        try:
            read_meta(files.root, manifest, split, fetch=files.sidecar if files.streamed else None)
        except DatasetError as exc:
            return [str(exc)]
        return []

    def verify_deep(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """The JSON against the manifest and the file sizes, every length within L and at most its
        count, and every row zero past its length (the documented padding)."""
        try:
            ds = self.open(out, split=split)
            return ds.check()
        except DatasetError as exc:
            return [str(exc)]

    def show(self, out: Path, manifest: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """The first events; none of a dataset at a URL (it is mapped from a local folder, never streamed)."""
        from shardsmith.kit.dataset_files import files_for

        return [] if files_for(out).streamed else super().show(out, manifest, n)

    def describe(self, out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        mm = manifest["memmap"]
        line = (f"memmap: N x {mm['max_len']} x {len(mm['fields'])} {np.dtype(mm['dtype']).name} "
                f"({', '.join(mm['fields'][:8])}{', …' if len(mm['fields']) > 8 else ''}), keep {mm.get('keep')}, "
                f"pad {mm.get('pad_value')}; {plural(len(mm['scalars']), 'event-level array')}")
        return {"memmap": mm, "format_lines": [line]}

    def card(self, out: Path, manifest: dict[str, Any]) -> Any:
        """The plain ``np.memmap`` recipe; ``datasets`` reads no raw arrays (``formats/memmap/card.py``)."""
        from shardsmith.formats.memmap.card import memmap_card

        return memmap_card(manifest)

    def report(self, out: Path, manifest: dict[str, Any], sampling: Any) -> list[Any]:
        """Values per event (before truncation), a histogram per stored field and scalar, label balance."""
        from shardsmith.formats.memmap.report import memmap_sections

        return memmap_sections(out, manifest, sampling)

    def show_one(self, sample: Any) -> dict[str, Any]:
        """An event: its length and first rows, then its scalars."""
        n = int(sample["length"])
        fields = {"values": {"shape": [n, sample["values"].shape[1]],
                             "first": sample["values"][:1].reshape(-1)[:4].tolist()}}
        fields.update({k: {"shape": list(np.shape(v)), "first": np.reshape(v, -1)[:3].tolist()}
                       for k, v in sample["scalars"].items()})
        return {"fields": fields}

    def bench(self, out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float) -> Rate:
        """Shuffled batches of padded events: events/s and MB/s."""
        return timed_batches(self.open(out, split=split), out=out, split=split, batch_size=batch_size,
                             seconds=seconds, how="exact shuffle",
                             measure=lambda batch: (len(batch["lengths"]), batch["values"].nbytes))
