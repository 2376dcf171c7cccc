"""Progress on stderr (tqdm), silent with --quiet."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass


class Progress:
    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet

    def note(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr)

    def warn(self, message: str) -> None:
        """A line the user should see even with --quiet."""
        print(f"shardsmith: warning: {message}", file=sys.stderr)

    @contextmanager
    def bar(self, *, total: int | None, desc: str, unit: str = "it") -> Iterator[Any]:
        """A bar to ``total`` (None: a counter, for work whose size is not known before it ends);
        bytes in kB/MB/GB, counts as they are."""
        if self.quiet:
            yield _Silent()
            return
        from tqdm import tqdm

        with tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", file=sys.stderr, leave=False,
                  dynamic_ncols=True) as bar:
            yield bar
