"""Lance datasets as a registered format: one dataset folder per split, ``{split}.lance/``, that
pylance opens (``lance.dataset(OUT / "train.lance")``, random access by ``take``), each shard one
data file and one fragment of it (``data/{split}-{000000}.lance``), rows in the shuffle's order.
The workers hand it typed samples (``formats/arrow_rows/rows.py``, as to parquet: rows, and
images as their bytes, extension and class), typed the same way (``writer.py``); once every shard is written, the split's table is committed over them
with the same bytes for the same shards (``table.py``: what pylance would write from the clock, and
how it is fixed). The manifest lists the data files as shards and the table's files as each
split's ``lance`` files, so ``verify`` checks every byte of the folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.core.own_files import Folder, OwnFiles
from shardsmith.formats.arrow_rows.format import ColumnsFormat
from shardsmith.formats.lance.names import FILE_VERSION, SUFFIX
from shardsmith.formats.lance.options import OPTIONS
from shardsmith.kit.format import CardData, WriteJob
from shardsmith.kit.writer import ShardRange, Writer

NOTE = ("Each split is a Lance dataset, a folder that pylance opens as it is: `lance.dataset(\"path/to/this/folder/"
        "train.lance\")`; `ds.take([i, j])` reads rows by their place in the dataset's shuffled order, "
        "`ds.to_table()` reads it whole. `__key__` names each row's input.")


class LanceFormat(ColumnsFormat):
    name = "lance"
    manifest_format = "lance"
    option = OPTIONS.to
    options = OPTIONS
    accepts = ("rows", "images")
    sample_unit = "row"
    own_files = OwnFiles(folders=(Folder("*" + SUFFIX),))  # {split}.lance/, all of it

    def reads(self, manifest: dict[str, Any]) -> bool:
        return super().reads(manifest) and "events" not in manifest  # events: ``events_format.py``

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.lance.writer import LanceShardWriter

        o = job.options
        return LanceShardWriter(out_dir=job.out, split=split, shard_samples=o.shard_samples,
                                shard_bytes=o.shard_bytes, part=part)

    def split_fields(self, job: WriteJob, split: str, output: Any) -> dict[str, Any]:
        """The split's dataset folder and its table's files (manifest, transaction, version hint)."""
        return {"lance": output.flat_record} if output.flat_record else {}

    def split_files(self, manifest: dict[str, Any]) -> list[dict[str, Any]]:
        """Each split's table files, hashed as they were written: ``verify`` checks them."""
        return [f for split in manifest["splits"].values() for f in (split.get("lance") or {}).get("files") or ()]

    def manifest_fields(self, job: WriteJob, outputs: dict[str, Any]) -> dict[str, Any]:
        """The data files' format and the pylance that wrote them (the table's bytes name it too)."""
        import lance

        return {"lance": {"file_version": FILE_VERSION, "pylance": lance.__version__}}

    def validate(self, manifest: dict[str, Any], bad: Any) -> None:
        for name, split in manifest["splits"].items():
            record = split.get("lance")
            if record is not None and not (isinstance(record, dict) and isinstance(record.get("files"), list)):
                bad(f"split {name!r}: 'lance' is not a record of the table's files")

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        from shardsmith.formats.lance.dataset import LanceShardsDataset

        return LanceShardsDataset(out_dir, split=split)

    def verify_layout(self, out: Any, manifest: dict[str, Any], split: str) -> list[str]:
        """Every shard's footer (a Lance file of as many rows as the manifest says) and, for a
        local folder, the split's table as pylance reads it."""
        from shardsmith.formats.lance.check import layout_problems

        return layout_problems(self.open(out, split=split), out, manifest, split)

    def describe(self, out: Any, manifest: dict[str, Any]) -> dict[str, Any]:
        """The data files' format and the table's folders, as one line of ``inspect``."""
        settings = manifest.get("lance") or {}
        folders = ", ".join(f"{(s.get('lance') or {}).get('dataset')}" for s in manifest["splits"].values())
        line = (f"lance: data files of format {settings.get('file_version')} (pylance {settings.get('pylance')}), "
                f"one fragment per shard; datasets {folders}")
        return {"lance": settings, "format_lines": [line]}

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        return CardData(notes=(NOTE,), unreadable="Lance datasets are read with pylance (lance.dataset) or "
                                                  "shardsmith.open, not HuggingFace datasets - see README.md")
