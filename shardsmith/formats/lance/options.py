"""The options of ``convert --to lance`` (light: ``convert --help`` reads it).

A shard is one Lance data file, one fragment of its split's dataset: fragments are what a Lance
reader opens, scans and caches one at a time. The shards roll over as every format's do
(``SHARD_SIZE``); Lance's own default is a file of at most a million rows."""

from __future__ import annotations

from shardsmith.kit.options import SHARD_SIZE, FormatOptions

OPTIONS = FormatOptions(to="lance", options=SHARD_SIZE)
