"""Warnings that point at the user's line, however deep in shardsmith they are raised.

A fixed ``stacklevel`` is right for one call path only (``mix`` -> ``Mixture`` is one frame more than
``Mixture`` itself, and a recipe's ``from_recipe`` more again); this counts the frames up to the
first one outside the package, as Python 3.12's ``skip_file_prefixes`` does.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parent.parent) + "/"


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the nearest caller outside shardsmith."""
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the caller of warn_user
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)
