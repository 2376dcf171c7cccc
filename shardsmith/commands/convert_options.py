"""The options of ``shardsmith convert``, as one frozen record every source and format reads from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardsmith.core.images import MAX_IMAGE_PIXELS
from shardsmith.engine.options import ConvertingOptions
from shardsmith.errors import UsageError
from shardsmith.kit.downsample import BalanceSpec


@dataclass(frozen=True, kw_only=True)
class ConvertOptions(ConvertingOptions):
    inputs: tuple[str, ...]
    out: Path
    to: str = "webdataset"
    source: str | None = None
    text_field: str | None = None
    check_images: str = "header"
    max_image_pixels: int = MAX_IMAGE_PIXELS  # at every check level but "none", augmenting too
    augment: str | None = None
    copies: int = 1
    quality: int = 90
    transforms: tuple[str, ...] = ()  # --transform NAME[=SPEC], applied to rows in this order
    balance: str | None = None  # --balance max=N|ratio=R[,label=FIELD] (kit/downsample.py)
    shard_samples: int | None = None
    shard_bytes: int = 256_000_000
    wids_md5: bool = False
    # events (ROOT, Parquet)
    tree: str | None = None
    branches: tuple[str, ...] | None = None
    step_size: int = 64 << 20
    group_by: str | None = None
    events_table: str | None = None
    compression: str = "none"
    events_per_sample: int = 1
    provenance: bool = False  # events: store each event's input file index and entry (core/provenance.py)
    # fixed-shape events (--to memmap): rows of --max-len values in --dtype, truncated by --keep
    max_len: int | None = None
    dtype: str = "float32"
    keep: str = "first"

    def __post_init__(self) -> None:
        if type(self.max_image_pixels) is not int or self.max_image_pixels < 1:
            raise UsageError(f"--max-image-pixels must be a whole number >= 1, got {self.max_image_pixels!r}")
        if self.balance is not None:
            BalanceSpec.parse(self.balance)  # a bad spec is refused before any work
