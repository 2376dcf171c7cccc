"""Progress on stderr: tqdm bars on a terminal; in a pipe or a log file, one plain line per step
when it ends (a bar's carriage returns would fill a log with half-drawn lines); nothing with --quiet."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shardsmith.core.words import plural


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass


class _Lines:
    """A bar for a pipe: counts, and says once what the step did and how long it took."""

    def __init__(self, *, desc: str, unit: str) -> None:
        self.desc, self.unit, self.n, self.postfix = desc, unit, 0, ""
        self.started = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def line(self) -> str:
        if self.unit == "B":
            size = next((f"{self.n / f:.1f} {u}" for f, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
                         if self.n >= f), f"{self.n} B")
        else:
            size = plural(self.n, self.unit.strip().removesuffix("s"))  # bars name units either way: "files", "unit"
        extra = f", {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {size}{extra}, {time.perf_counter() - self.started:.1f} s"


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
        if not sys.stderr.isatty():
            lines = _Lines(desc=desc, unit=unit)
            yield lines
            print(lines.line(), file=sys.stderr, flush=True)
            return
        from tqdm import tqdm

        with tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", file=sys.stderr, leave=False,
                  dynamic_ncols=True) as bar:
            yield bar
