"""Tokens are written by ``pack-tokens`` (its own options), not by ``convert --to``: nothing to declare.
Light, as every format's options module: the registry reads it without importing numpy."""

from __future__ import annotations

from shardsmith.kit.options import FormatOptions

OPTIONS = FormatOptions(to=None)
