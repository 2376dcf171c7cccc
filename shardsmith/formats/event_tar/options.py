"""The options of ``convert --to webdataset`` for events (light: ``convert --help`` reads it)."""

from __future__ import annotations

from shardsmith.kit.options import MAX_INT32, SHARD_SIZE, FormatOptions, Option

OPTIONS = FormatOptions(to="webdataset", options=(
    *SHARD_SIZE,
    Option(name="events_per_sample", type="int", default=1, low=1, high=MAX_INT32,
           help="Events: pack windows of N events into one tar sample."),
))
