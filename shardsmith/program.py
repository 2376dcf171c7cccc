"""The ``shardsmith`` program's entry point: Ctrl-C and SIGTERM are handled (``shardsmith.engine.interrupt``)
before the command line's modules are imported, so an interruption at start-up is one line too."""

from __future__ import annotations


def main() -> None:
    from shardsmith.engine import interrupt

    interrupt.install()
    try:
        from shardsmith.cli import main as cli
    except KeyboardInterrupt as exc:
        import os
        import sys

        sys.stderr.write(f"{interrupt.line_start()}shardsmith: {interrupt.MESSAGE}\n")
        sys.stderr.flush()
        os._exit(interrupt.exit_code(exc))
    cli()


if __name__ == "__main__":
    main()
