"""The options of ``convert --to webdataset`` for images and rows (light: ``convert --help`` reads it)."""

from __future__ import annotations

from shardsmith.kit.options import SHARD_SIZE, FormatOptions, Option

OPTIONS = FormatOptions(to="webdataset", options=(
    *SHARD_SIZE,
    Option(name="wids_md5", type="flag", help="Also record each shard's md5 in the wids index (costs a pass)."),
))
