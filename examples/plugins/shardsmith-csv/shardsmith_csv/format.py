"""Rows written back out as CSV (or TSV) shards: the ``csv`` format, ``shardsmith convert --to csv``.

The format's options are declared in ``options.py`` (``--shard-samples``, and its own
``--csv-delimiter``); its writers get them as ``job.options``, and the manifest records them
(``format_options``), where the dataset reads its delimiter back. A shard is
``{split}-000000.csv`` (``.tsv`` with ``--csv-delimiter tab``): a header row (``__key__``, then
every column its rows hold, in the order first seen), then one row per sample in output order; a
value that is not a string is written as JSON (bytes and arrays, which a cell cannot hold, are
left out). The format gives no encoder of its own (``Format.encoder``), so its writer is handed
each sample in the neutral encoding and reads it back with ``Sample.decode``: the key and the
fields the source gave (``Reader.sample_fields``), typed; no other format's layout to parse.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.plugin import (
    SHARD_NAMES,
    Dataset,
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
from shardsmith_csv.options import OPTIONS

DELIMITERS = {"comma": ",", "tab": "\t"}


class CsvFormat(Format):
    """Rows as CSV or TSV shards (``holds = "rows"``)."""

    name = "csv"
    manifest_format = "csv"
    option = OPTIONS.to
    options = OPTIONS  # the same declaration the registry reads from options.py
    accepts = ("rows",)
    sample_unit = "row"
    # the files it writes into an output (what --overwrite removes and an S3 output uploads): its
    # shards, named by Writer.shard_name; a format written as folders declares them (plugin.Folder)
    own_files = OwnFiles(files=(SHARD_NAMES,))

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        return CsvWriter(out_dir=job.out, split=split, delimiter=DELIMITERS[job.options.csv_delimiter],
                         shard_samples=job.options.shard_samples, part=part)

    def validate(self, manifest: dict[str, Any], bad: Any) -> None:
        delimiter = (manifest.get("format_options") or {}).get("csv_delimiter")
        if delimiter not in DELIMITERS:
            raise bad(f"'format_options.csv_delimiter' must be one of {', '.join(DELIMITERS)}, not {delimiter!r}")

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> CsvDataset:
        return CsvDataset(out_dir, split=split)

    def describe(self, out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        return {"format_lines": [f"csv: delimiter {manifest['format_options']['csv_delimiter']}"]}

    def show_one(self, sample: Any) -> dict[str, Any]:
        """A row: its key, and each column's length."""
        return {"key": sample["__key__"], "members": {k: len(v) for k, v in sample.items() if k != "__key__"}}


class CsvWriter(Writer):
    """One writer goes through a split (``rangeable`` False), a shard every ``shard_samples`` rows."""

    name = "csv"

    def __init__(self, *, out_dir: Path, split: str, delimiter: str, shard_samples: int | None,
                 part: ShardRange | None = None) -> None:
        super().__init__(out_dir=out_dir, split=split, part=part)
        self.delimiter = delimiter
        self.ext = ".tsv" if delimiter == "\t" else ".csv"  # the source reads both back
        self.shard_samples = shard_samples
        self.rows: list[dict[str, Any]] = []

    @property
    def rangeable(self) -> bool:
        return False

    def write_batch(self, lengths: Any, payload: memoryview) -> None:
        pos = 0
        for n in (int(x) for x in lengths):
            self.rows.append(_row(payload[pos:pos + n]))
            pos += n
            if self.shard_samples is not None and len(self.rows) == self.shard_samples:
                self._flush()

    def _flush(self) -> None:
        columns = list(dict.fromkeys(k for row in self.rows for k in row))
        text = io.StringIO()
        out = csv.writer(text, delimiter=self.delimiter, lineterminator="\n")
        out.writerow(columns)
        out.writerows([_cell(row.get(c, "")) for c in columns] for row in self.rows)
        data = text.getvalue().encode("utf-8")
        name = self.shard_name(self.next_index(), self.ext)
        tmp = self.out_dir / f".{name}.tmp-{os.getpid()}"  # a killed run's is its own (shardsmith's naming)
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.out_dir / name)
        self.shards.append(ShardRecord(path=name, samples=len(self.rows), bytes=len(data),
                                       sha256=hashlib.sha256(data).hexdigest()))
        self.md5s.append(None)
        self.rows = []

    def close(self) -> list[ShardRecord]:
        if self.rows:
            self._flush()
        return self.shards

    def abort(self) -> None:
        self.rows = []


def _row(payload: memoryview) -> dict[str, Any]:
    """A sample as its row: the key, then the fields a cell can hold."""
    sample = Sample.decode(payload)
    return {"__key__": sample.key, **{k: v for k, v in sample.fields.items() if not isinstance(v, bytes | np.ndarray)}}


def _cell(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class CsvDataset(Dataset):
    """A split's rows, read whole on open (an example's datasets are small): ``len``, ``ds[i]`` (a
    dict of strings) and ``read``, the loader's dataset protocol (with ``kind``), which gives it
    ``iter`` (shuffled by seed and epoch, split over ranks, resumable), the torch adapters and mixtures."""

    kind = SampleKind("csv rows", ListForm())

    def __init__(self, out_dir: Any, *, split: str) -> None:
        """``out_dir``: a folder, or what ``shardsmith.open`` hands a format (a folder or a URL's files)."""
        from shardsmith.kit.dataset_files import files_for

        files = files_for(out_dir)  # the manifest checked, every shard inside the folder (or the URL's cache)
        manifest, shards = files.load_split(fmt=CsvFormat.manifest_format, split=split)
        delimiter = DELIMITERS[manifest["format_options"]["csv_delimiter"]]
        self.rows: list[dict[str, str]] = []
        for s in range(len(shards)):
            path, _, fd = files.local(s)
            try:
                with open(path, newline="", encoding="utf-8") as fh:
                    self.rows += list(csv.DictReader(fh, delimiter=delimiter))
            finally:
                if fd is not None:
                    os.close(fd)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, str]:
        return self.rows[i]

    def read(self, indices: Any) -> list[dict[str, str]]:
        return [self.rows[int(i)] for i in np.asarray(indices).reshape(-1)]
