"""The command line a run was given, as the manifest and the dataset card record it.

The command group records the arguments it parses (``cli._Main.main``): in a shell they are
``sys.argv[1:]``, in a test that calls the CLI in-process they are the test's, not pytest's. The
program is recorded as ``shardsmith`` (not the path of the script or of ``__main__.py``), and URLs
without their credentials or query (``urls.safe_argv``).
"""

from __future__ import annotations

import sys

from shardsmith.core.urls import safe_argv

_args: list[str] | None = None


def record(args: list[str] | None) -> None:
    """The arguments the command line was given (after the program's name); None when it has ended."""
    global _args
    _args = None if args is None else list(args)


def command_line() -> list[str]:
    """``["shardsmith", *arguments]``, safe to record; the process's own arguments when no command
    line was parsed (a library call)."""
    args = sys.argv[1:] if _args is None else _args
    return ["shardsmith", *safe_argv(args)]
