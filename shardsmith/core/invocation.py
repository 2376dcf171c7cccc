"""The command line a run was given, as the manifest and the dataset card record it.

The command group records the arguments it parses (``cli._Main.main``): in a shell they are
``sys.argv[1:]``, in a test that calls the CLI in-process they are the test's, not pytest's. The
program is recorded as ``shardsmith`` (not the path of the script or of ``__main__.py``), and URLs
without their credentials or query (``urls.safe_argv``).

With the arguments the command group also gives the way to compare them with another command line
(``cli_changes.differences``: click parses both), so that a refusal can say which options differ
from those a finished dataset was made with; a library call has no command line to compare.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from shardsmith.core.urls import safe_argv

# (the arguments of another command line, these arguments) -> what differs, or None when it cannot tell
Differ = Callable[[list[str], list[str]], "list[str] | None"]

_args: list[str] | None = None
_differ: Differ | None = None


def record(args: list[str] | None, *, differ: Differ | None = None) -> None:
    """The arguments the command line was given (after the program's name), and how to compare them
    with another command line's; None when it has ended."""
    global _args, _differ
    _args = None if args is None else list(args)
    _differ = None if args is None else differ


def command_line() -> list[str]:
    """``["shardsmith", *arguments]``, safe to record; the process's own arguments when no command
    line was parsed (a library call)."""
    args = sys.argv[1:] if _args is None else _args
    return ["shardsmith", *safe_argv(args)]


def differences(recorded: list[str]) -> list[str] | None:
    """How this command line differs from ``recorded`` (a manifest's ``command``: ``["shardsmith",
    *arguments]``), one phrase per option (``--seq-len 128 (now 64)``); None when it cannot tell (a
    library call, or a recorded command line that does not parse)."""
    if _args is None or _differ is None or not recorded:
        return None
    return _differ([str(a) for a in recorded[1:]], safe_argv(_args))
