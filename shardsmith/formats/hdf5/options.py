"""The options of ``convert --to hdf5`` (light: ``convert --help`` reads it without importing h5py)."""

from __future__ import annotations

from shardsmith.kit.options import SHARD_SIZE, FormatOptions, Option

OPTIONS = FormatOptions(to="hdf5", options=(
    *SHARD_SIZE,
    Option(name="compression", choices=("none", "lzf", "gzip", "blosc"), default="none",
           help="Compression of the event arrays (gzip is the portable choice)."),
))
