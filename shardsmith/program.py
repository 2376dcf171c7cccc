"""The ``shardsmith`` program's entry point: Ctrl-C and SIGTERM are handled from its first line on,
before the command line's modules are imported, so an interruption at start-up is one line too.

Its first statement hands both signals to a recorder made of builtins only (``_signal`` is part of
the interpreter: nothing to import, so nothing to interrupt); ``interrupt.install`` then takes over
and holds a signal the recorder caught, as it holds any during start-up. What runs before this
function (the interpreter's own start-up, then ``shardsmith/__init__.py``, a millisecond) keeps
Python's defaults.

Before this function's first line (the interpreter's own start-up, ``site`` and ``runpy``: about
the first 35 ms here) Python's defaults apply: SIGTERM ends the process, SIGINT prints Python's
traceback.
"""

from __future__ import annotations


def main() -> None:
    import _signal

    early: list[int] = []
    _signal.signal(_signal.SIGINT, lambda signum, frame: early.append(signum))
    _signal.signal(_signal.SIGTERM, lambda signum, frame: early.append(signum))
    try:
        from shardsmith.core.faults import crash_point

        crash_point("start-up")  # (the tests hold a run here: a signal then meets the recorder alone)
        from shardsmith.engine.processes import interrupt

        interrupt.install(early=early)
        from shardsmith.cli import main as cli
    except KeyboardInterrupt as exc:  # (a fallback: start-up holds signals)
        import os
        import sys

        sys.stderr.write(f"{interrupt.line_start()}shardsmith: {interrupt.MESSAGE}\n")
        sys.stderr.flush()
        os._exit(interrupt.exit_code(exc))
    cli()


if __name__ == "__main__":
    main()
