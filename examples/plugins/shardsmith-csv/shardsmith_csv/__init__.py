"""shardsmith-csv: the worked example of a shardsmith plugin (see README.md).

CSV and TSV files as a source (``csv``, ``source.py``), a text transform (``normalize``,
``source.py``), rows written back out as CSV or TSV shards (the ``csv`` format, ``format.py``,
whose options are declared in ``options.py``), and a record kind of its own: key/value pairs
(``pairs``, ``pairs.py``), held by a source of ``.properties`` files (``properties``). This package module stays light (it imports
nothing): ``shardsmith convert --help`` imports ``shardsmith_csv.options`` to show the format's
options, and the classes are imported only when the registry asks for them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CsvFormat", "CsvSource", "NormalizeText", "PairsKind", "PropertiesSource"]

_WHERE = {"CsvSource": "source", "NormalizeText": "source", "CsvFormat": "format", "PairsKind": "pairs",
          "PropertiesSource": "pairs"}


def __getattr__(name: str) -> Any:
    """``shardsmith_csv:CsvSource`` and the others, imported on first use (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module 'shardsmith_csv' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"shardsmith_csv.{_WHERE[name]}"), name)
