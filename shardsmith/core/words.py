"""Counts in words, as a user reads them: ``1 shard``, ``2 shards``, ``1 entry``, ``3 entries``.

One place for the rule, so that no summary, progress line, report or error says "1 shards" and
none spells its own ``if n == 1``. Counts are grouped by thousands (``12,345 records``), as
``inspect`` and the reports wrote them.
"""

from __future__ import annotations

_SIBILANT = ("s", "x", "z", "ch", "sh")


def _noun(count: int, noun: str, many: str | None) -> str:
    """``noun`` as it goes with ``count``: itself for one, else its plural (``many``, or the regular
    English plural of its last word: entry/entries, class/classes, file/files)."""
    if count == 1:
        return noun
    if many is not None:
        return many
    if noun.endswith("y") and noun[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    if noun.endswith(_SIBILANT):
        return noun + "es"
    return noun + "s"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and the noun that goes with it: ``1 shard``, ``2 shards``, ``1,024 input files``."""
    return f"{count:,} {_noun(count, noun, many)}"
