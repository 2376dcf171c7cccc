"""The options of ``shardsmith convert``: one frozen record of the run's and the source's options,
and the options of the format it writes (``format_options``, declared by the formats: ``kit/options.py``)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsmith.core.images import MAX_IMAGE_PIXELS, require_pillow
from shardsmith.engine import ConvertingOptions
from shardsmith.errors import UsageError
from shardsmith.kit.downsample import BalanceSpec
from shardsmith.kit.options import FormatOptions, OptionValues, refusal

if TYPE_CHECKING:
    from shardsmith.kit.format import Format


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
    # events (ROOT, Parquet)
    tree: str | None = None
    branches: tuple[str, ...] | None = None
    step_size: int = 64 << 20
    group_by: str | None = None
    events_table: str | None = None
    # the format's options by name (--shard-bytes, --compression, --max-len, ...): as given for --to,
    # then (``for_format``) exactly the writing format's, checked and with its defaults
    format_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if type(self.max_image_pixels) is not int or self.max_image_pixels < 1:
            raise UsageError(f"--max-image-pixels must be a whole number >= 1, got {self.max_image_pixels!r}")
        if self.balance is not None:
            BalanceSpec.parse(self.balance)  # a bad spec is refused before any work
        if self.check_images == "full":
            require_pillow("--check-images full")

    def __getattr__(self, name: str) -> Any:
        """A format option read as ``opts.NAME`` (``job.opts.NAME``: a format written before formats
        declared their options): its value, with a DeprecationWarning naming the new way."""
        values = self.__dict__.get("format_options") or {}
        if name.startswith("_") or name not in values:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warnings.warn(f"job.opts.{name} is deprecated: a format declares its options (shardsmith.kit.options."
                      f"FormatOptions, as Format.options) and reads them as job.options.{name}",
                      DeprecationWarning, stacklevel=2)
        return values[name]

    def format_values(self) -> OptionValues:
        """The format's options as its writers get them (``WriteJob.options``)."""
        return OptionValues(values=self.format_options)

    def for_format(self, fmt: Format, declared: Mapping[str, FormatOptions], *, holds: str) -> ConvertOptions:
        """These options with exactly ``fmt``'s own options, checked and with their defaults: an option of
        another format given a value other than its default is refused (one line), never ignored.
        ``declared``: every format's declaration by name (``registry.format_options``)."""
        own = declared.get(fmt.name) or FormatOptions(to=fmt.option)
        for name, value in self.format_options.items():
            if name in own.names():
                continue
            owners = {n: d for n, d in declared.items() if name in d.names()}
            if not owners:
                raise UsageError(f"--{name.replace('_', '-')}: no format has this option")
            option = next(o for o in next(iter(owners.values())).options if o.name == name)
            if option.value(value) == option.default_value():
                continue
            siblings = [n for n, d in owners.items() if d.to == fmt.option]
            if not siblings:
                raise UsageError(refusal(name, value, to=fmt.option or "", declared=owners.values()) or "")
            from shardsmith import registry

            kinds = sorted({k for n in siblings for k in registry.format_named(n).accepts})
            raise UsageError(f"{option.flag} does not apply to --to {fmt.option} for {holds} "
                             f"(it applies to {', '.join(kinds)})")
        return replace(self, format_options=own.values(self.format_options).as_dict())
