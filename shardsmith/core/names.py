"""Names that are not UTF-8: a path with stray bytes, which Python holds as surrogates (PEP 383).

Paths name records, keys and manifest entries and are recorded in run records and locks, all UTF-8
text: such a name is refused, shown with its bytes escaped (``caf\\xe9``), by the command line (its
arguments) and by the input listing (the names below the input root) alike. Standard library only:
the command line imports it before it parses anything.
"""

from __future__ import annotations

import os


def not_utf8(text: str) -> str | None:
    """``text`` as shown with its stray bytes escaped when it is not valid UTF-8; None when it is."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    return None
