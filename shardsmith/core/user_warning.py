"""Warnings that point at the user's line, however deep in shardsmith they are raised.

A fixed ``stacklevel`` is right for one call path only (``mix`` -> ``Mixture`` is one frame more than
``Mixture`` itself, and a recipe's ``from_recipe`` more again); this counts the frames up to the
first one outside the package, as Python 3.12's ``skip_file_prefixes`` does.

On the command line there is no user's line (the first frame outside the package is click's), so
the program shows these warnings as its other warnings, one ``shardsmith: warning:`` line
(``as_lines``).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from shardsmith.errors import ShardsmithWarning

_PACKAGE = str(Path(__file__).resolve().parent.parent) + "/"


def warn_user(message: str, category: type[Warning] = ShardsmithWarning) -> None:
    """``warnings.warn`` attributed to the nearest caller outside shardsmith."""
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the caller of warn_user
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)


@contextlib.contextmanager
def as_lines() -> Iterator[None]:
    """Within: a ``ShardsmithWarning`` that the filters let through is printed as one line
    (``shardsmith: warning: MESSAGE``) on stderr, not as Python's file:line and source; any other
    warning is shown as before. The filters still decide (``-W error`` still raises)."""
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> Any:
        if not issubclass(category, ShardsmithWarning):
            return shown(message, category, filename, lineno, file, line)
        with contextlib.suppress(OSError, ValueError):  # a closed stderr: the warning is lost, as Python's is
            print(f"shardsmith: warning: {message}", file=file or sys.stderr, flush=True)
        return None

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
