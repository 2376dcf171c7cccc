"""The options of the ``csv`` format, declared where ``shardsmith convert --help`` reads them.

Registered through the ``shardsmith.format_options`` entry point group (same name as the format),
so this module must stay light: it imports ``shardsmith.kit.options`` (standard library only) and
nothing else, and the format's own module (``format.py``) is imported only when it writes or reads.
"""

from __future__ import annotations

from shardsmith.kit.options import SHARD_SAMPLES, FormatOptions, Option

OPTIONS = FormatOptions(to="csv", options=(
    SHARD_SAMPLES,  # shared with the built-in formats (the same declaration: one --shard-samples)
    Option(name="csv_delimiter", choices=("comma", "tab"), default="comma",
           help="Write comma-separated .csv shards, or tab-separated .tsv shards."),
))
