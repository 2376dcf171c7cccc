"""MosaicML Streaming's MDS as a registered format (``convert --to mds``): rows and images, each split a
folder ``mds/{split}/`` of ``shard.{00000}.mds`` files and its ``index.json``
(``streaming.StreamingDataset(local=OUT/mds, split=SPLIT)`` reads it, in our order with its own
shuffle off); a dataset of one split also gets an ``index.json`` at the top of the folder over that
split's shards, so ``StreamingDataset(local=OUT)`` reads it as it is.

Samples are encoded in the workers (``encoding.py``), shards built by the writer (``writer.py``,
``shard.py``); shardsmith reads the shards back itself for ``inspect`` and ``verify --deep``
(``dataset.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.core import manifest as m_
from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.core.own_files import Folder, OwnFiles
from shardsmith.errors import DatasetError, UsageError
from shardsmith.formats.mds.options import OPTIONS
from shardsmith.kit.format import CardData, Format, WriteJob
from shardsmith.kit.sample import KEY, SampleEncoder
from shardsmith.kit.writer import ShardRange, Writer

INDEX = "index.json"  # (shard.INDEX: named here too, so that the registry imports no more than this module)
MAX_SHARD_BYTES = 2 << 30  # offsets are uint32: a shard of this payload and one large sample stays below 4 GiB


class MdsFormat(Format):
    name = "mds"
    manifest_format = "mds"
    option = OPTIONS.to
    options = OPTIONS
    accepts = ("rows", "images")
    # ``mds/{split}/``: each split's shards and index; the top-level index (one split). Never a
    # folder of another name: a user's folder beside the dataset is not the format's to remove
    own_files = OwnFiles(files=(INDEX,), folders=(Folder("mds", holds=("*/shard.[0-9][0-9][0-9][0-9][0-9].mds",
                                                                       f"*/{INDEX}")),))

    def check(self, job: WriteJob) -> None:
        if not 0 < job.options.shard_bytes <= MAX_SHARD_BYTES:
            raise UsageError(f"--shard-bytes: an MDS shard holds at most {MAX_SHARD_BYTES >> 30}GiB "
                             "(its offsets are 32-bit)")

    def encoder(self, job: WriteJob, kind: str) -> SampleEncoder:
        from shardsmith.formats.mds.encoding import MdsEncoder

        encoders = {"rows": MdsEncoder, "images": lambda: MdsEncoder(images=True)}  # (as webdataset's)
        return encoders[kind]()

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.mds.writer import MdsWriter

        o = job.options
        return MdsWriter(out_dir=job.out, split=split, shard_samples=o.shard_samples, shard_bytes=o.shard_bytes,
                         part=part)

    def split_fields(self, job: WriteJob, split: str, output: Any) -> dict[str, Any]:
        from shardsmith.formats.mds.writer import index_name

        return {"mds_index": index_name(split)}

    def manifest_fields(self, job: WriteJob, outputs: dict[str, Any]) -> dict[str, Any]:
        """With one split, the top-level ``index.json`` over its shards (basenames under its folder,
        as ``streaming``'s ``merge_index`` writes them), made once the split is finished. With several,
        none: ``local=OUT`` alone would read every split as one."""
        if len(outputs) != 1:
            return {"mds": {"root_index": None}}
        from shardsmith.formats.mds.shard import index_entry, index_json

        (split, output), = outputs.items()
        entries = [index_entry(basename=s.path, samples=s.samples, nbytes=s.bytes,
                               columns=tuple((n, e) for n, e in s.extra["mds"]["columns"]),
                               size_limit=job.options.shard_bytes) for s in output.shards]
        atomic_write_bytes(Path(job.out) / INDEX, index_json(entries))
        return {"mds": {"root_index": INDEX}}

    def side_files(self, manifest: dict[str, Any]) -> list[str]:
        """Every split's ``index.json``, and the top-level one: hashed into the manifest's ``files``."""
        root = (manifest.get("mds") or {}).get("root_index")
        return [*(s["mds_index"] for s in manifest["splits"].values() if isinstance(s.get("mds_index"), str)),
                *([root] if isinstance(root, str) else [])]

    def validate(self, m: dict[str, Any], bad: Any) -> None:
        for name, split in m["splits"].items():
            index = m_.need(split, "mds_index", str, bad, where=f"splits.{name}.")
            if not m_.safe_relative(index):
                raise bad(f"'splits.{name}.mds_index' {index!r} is not a plain relative path inside the dataset folder")
            for shard in split["shards"]:
                columns = (shard.get("mds") or {}).get("columns")
                if not isinstance(columns, list) or not all(isinstance(c, list) and len(c) == 2 for c in columns):
                    raise bad(f"shard {shard['path']!r} of split {name!r} names no MDS columns")

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        from shardsmith.formats.mds.dataset import MdsDataset

        return MdsDataset(out_dir, split=split)

    def verify_layout(self, out: Any, manifest: dict[str, Any], split: str) -> list[str]:
        """Each shard's header: its sample count, config and offsets, as the manifest says."""
        try:
            ds = self.open(out, split=split)
            for s in range(len(ds.entries)):
                ds.shard(s)
        except DatasetError as exc:
            return [str(exc)]
        return []

    def verify_deep(self, out: Any, manifest: dict[str, Any], split: str) -> list[str]:
        """Every sample decoded, its key present."""
        try:
            ds = self.open(out, split=split)
            return [f"{split}[{i}]: no key" for i in range(len(ds)) if not ds[i].get(KEY)]
        except DatasetError as exc:
            return [str(exc)]

    def describe(self, out: Any, manifest: dict[str, Any]) -> dict[str, Any]:
        """The columns and encodings of every shard (a field reconciled into ``json`` in some shards
        shows up twice)."""
        columns = {tuple(c) for s in manifest["splits"].values() for sh in s["shards"] for c in sh["mds"]["columns"]}
        listed = ", ".join(f"{n} ({e})" for n, e in sorted(columns)) or "none"
        return {"mds_columns": sorted(columns), "format_lines": [f"mds columns: {listed}"]}

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        splits = list(manifest["splits"])
        local = "local=\".\"" if len(splits) == 1 else f"local=\"mds\", split=\"{splits[0]}\""
        recipe = "\n".join([
            "With mosaicml-streaming (`pip install mosaicml-streaming`), from this folder:", "",
            "```python",
            "from streaming import StreamingDataset",
            "",
            f"ds = StreamingDataset({local}, shuffle=False, batch_size=1)  # in shardsmith's shuffled order",
            "```"])
        return CardData(notes=(recipe,), unreadable="MDS shards are read with mosaicml-streaming's StreamingDataset "
                                                    "or shardsmith.open, not HuggingFace datasets - see README.md")

    def show_one(self, sample: Any) -> dict[str, Any]:
        """A sample's key, and each column's size (text and bytes) or value (numbers) or type."""
        return {"key": sample.get(KEY),
                "members": {k: (len(v) if isinstance(v, bytes | str) else v if isinstance(v, int | float) else
                                type(v).__name__) for k, v in sample.items() if k != KEY}}
