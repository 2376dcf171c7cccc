"""WebDataset tar shards of samples as a registered format: images, JSON rows, text and binary
columns, each sample a run of ``{key}.{ext}`` members (made in the workers: ``members.py``), with a
wids index and offset indexes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from shardsmith.core import manifest as m_
from shardsmith.errors import DatasetError
from shardsmith.formats.webdataset.names import OWN_FILES, wids_files, wids_name
from shardsmith.formats.webdataset.options import OPTIONS
from shardsmith.kit.format import CardData, Format, Rate, WriteJob
from shardsmith.kit.sample import SampleEncoder
from shardsmith.kit.writer import ShardRange, Writer

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")


class WebDatasetFormat(Format):
    name = "webdataset"
    manifest_format = "webdataset"
    option = OPTIONS.to
    options = OPTIONS
    accepts = ("images", "rows")
    copies_files = True
    own_files = OWN_FILES

    def validate(self, m: dict[str, Any], bad: Any) -> None:
        """The manifest fields this format's readers read, each typed (``core.manifest.check``)."""
        classes = m_.need(m, "classes", list, bad, optional=True, nullable=True)
        if classes is not None and not all(isinstance(c, str) for c in classes):
            raise bad("'classes' must be a list of names")
        m_.count(m, "max_image_pixels", bad, optional=True, low=1)
        for name, split in m["splits"].items():
            wids = m_.need(split, "wids", str, bad, where=f"splits.{name}.", optional=True)
            if wids is not None and not m_.safe_relative(wids):
                raise bad(f"'splits.{name}.wids' {wids!r} is not a plain relative path inside the dataset folder")
            for shard in split["shards"]:
                if "index" in shard:  # (datasets of before the offset indexes have none)
                    m_.file_entry(shard["index"], bad, f"splits.{name}.shards[].index")

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.webdataset.writer import TarWriter

        o = job.options
        return TarWriter(out_dir=job.out, split=split, shard_samples=o.shard_samples, shard_bytes=o.shard_bytes,
                         wids_md5=o.wids_md5, sources=job.sources, threads=max(2, job.workers), part=part)

    def encoder(self, job: WriteJob, kind: str) -> SampleEncoder:
        """Rows (and every kind written as rows) and images as tar members (``members.py``)."""
        from shardsmith.formats.webdataset.members import ImageMembers, TarMembers

        encoders = {"rows": TarMembers, "images": lambda: ImageMembers(by_reference=job.sources is not None)}
        return encoders[kind]()

    def file_copier(self, job: WriteJob) -> Any:
        """Images unchanged: the tar shards of the engine's copy mode (``image_tar.TarCopier``)."""
        from shardsmith.formats.webdataset.image_tar import TarCopier

        o = job.options
        return TarCopier(shard_samples=o.shard_samples, shard_bytes=o.shard_bytes, wids_md5=o.wids_md5)

    def split_fields(self, job: WriteJob, split: str, output: Any) -> dict[str, Any]:
        return {"wids": wids_name(split)}

    def side_files(self, manifest: dict[str, Any]) -> list[str]:
        return wids_files(manifest)

    def verify_files(self, read: Any, manifest: dict[str, Any], *, failed: set[str]) -> list[str]:
        from shardsmith.formats.webdataset.wids_check import wids_problems

        return wids_problems(read, manifest, failed=failed)

    def reads(self, manifest: dict[str, Any]) -> bool:
        return super().reads(manifest) and "events" not in manifest

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        from shardsmith.formats.webdataset.dataset import TarDataset

        return TarDataset(out_dir, split=split, decode=decode)

    def verify_layout(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """Every shard's offset index as the loader takes it (``TarDataset.check_indexes``)."""
        try:
            self.open(out, split=split).check_indexes()
        except DatasetError as exc:
            return [str(exc)]
        return []

    def verify_deep(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """Every header read, every sample opened, and (image datasets) every image decoded."""
        from shardsmith.core.images import ImageError, check_image

        problems: list[str] = []
        try:
            ds = self.open(out, split=split)
            ds.check_headers()  # ds[i] trusts the offset index beyond a few spot checks: read every header
            images = "classes" in manifest
            for i in range(len(ds)):
                sample = ds[i]
                for ext, value in sample.items():
                    if images and ext in IMAGE_EXTS:
                        try:
                            check_image(value, level="full", max_pixels=ds.max_image_pixels)  # the loader's limit
                        except ImageError as exc:
                            problems.append(f"{split}[{i}] {sample['__key__']}.{ext}: {exc}")
        except DatasetError as exc:
            problems.append(str(exc))
        return problems

    def describe(self, out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        return {"classes": manifest.get("classes"), "augment": manifest.get("augment")}

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        """The ``webdataset`` builder of ``datasets`` reads the shards; ``cls`` is named by the classes."""
        from shardsmith.formats.webdataset.card import tar_card

        return tar_card(out, manifest)

    def report(self, out: Path, manifest: dict[str, Any], sampling: Any) -> list[Any]:
        """Classes and image sizes when the samples hold images; bytes per sample and per member."""
        from shardsmith.formats.webdataset.report import tar_sections

        return tar_sections(out, manifest, sampling)

    def show_one(self, sample: Any) -> dict[str, Any]:
        """A sample: its key, and each member's size (or an array's dtype and shape)."""
        return {"key": sample["__key__"], "members": {k: _member(v) for k, v in sample.items() if k != "__key__"}}

    def bench(self, out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float) -> Rate:
        return timed_samples(self.open(out, split=split), out=out, split=split, seconds=seconds)


def _member(value: Any) -> Any:
    """What a member is, in a line: its size, an array's dtype and shape, or a small decoded value."""
    if isinstance(value, bytes | str):
        return len(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    return value


def timed_samples(ds: Any, *, out: Path, split: str, seconds: float) -> Rate:
    """Shuffled random access over a sample dataset: samples/s and MB/s of member bytes, no decoding."""
    if len(ds) == 0:
        raise DatasetError(f"{out}: split {split!r} is empty")
    samples = nbytes = epoch = 0
    it = ds.iter(shuffle=True, seed=0, epoch=epoch)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for sample in it:
            samples += 1
            nbytes += sum(len(v) for k, v in sample.items() if isinstance(v, bytes))
            if samples % 256 == 0 and time.perf_counter() - t0 >= seconds:
                break
        else:
            epoch += 1
            it = ds.iter(shuffle=True, seed=0, epoch=epoch)
    elapsed = time.perf_counter() - t0
    rate = samples / elapsed
    return Rate(rate, "samples/s", f"{out} [{split}]: {rate:,.0f} samples/s, {nbytes / elapsed / 1e6:,.0f} MB/s "
                f"(exact shuffled order, random access, no decoding, one process)")
