"""One answer computed in a forked child and read back through a pipe: the pattern of work that
holds the GIL (listing a big folder, the tokenizer check's reference side) run beside this process.

The child ends with its parent (``interrupt.end_with_parent``; it ignores Ctrl-C as every forked
child of the command line does) and leaves with ``os._exit``, running none of the parent's exit
code. ``result`` is None when the child failed: the caller then does the work itself and meets any
error there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable


class ForkedAnswer:
    """``make()`` (bytes) in a forked child; ``result()`` reads them back (once)."""

    def __init__(self, make: Callable[[], bytes]) -> None:
        from shardsmith.engine.processes.interrupt import held

        read, write = os.pipe()
        with held():  # a signal while the fork runs its handlers: raised after it (``workers.worker_pool``)
            self.pid = os.fork()
        if self.pid == 0:  # the child: compute, send, leave
            code = 1
            try:
                from shardsmith.engine.processes.interrupt import end_with_parent

                end_with_parent()  # an interrupted or killed run leaves no child behind
                os.close(read)
                with os.fdopen(write, "wb") as out:
                    out.write(make())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self.fd = read

    def cancel(self) -> None:
        """Stop the child (its answer is not needed) and reap it."""
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.close(self.fd)
        os.waitpid(self.pid, 0)

    def result(self) -> bytes | None:
        """The child's bytes, or None when it failed."""
        try:
            chunks = []
            while chunk := os.read(self.fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(self.fd)
            _, status = os.waitpid(self.pid, 0)
        return b"".join(chunks) if status == 0 else None
