"""The options of ``convert --to mds`` (light: ``convert --help`` reads it without importing the format)."""

from __future__ import annotations

from shardsmith.kit.options import SHARD_SIZE, FormatOptions

# the shard size every --to declares (one declaration per name); an MDS shard's offsets are uint32,
# so ``MdsFormat.check`` refuses a --shard-bytes that could pass 4 GiB
OPTIONS = FormatOptions(to="mds", options=SHARD_SIZE)
