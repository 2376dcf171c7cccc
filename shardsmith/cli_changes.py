"""Which options of a command line differ from those of another: what a refusal says when an output
folder holds a finished dataset that other options made (``engine/output/outdir.py``).

Both command lines are parsed by click, as the command itself parses them (defaults filled in, sizes
and splits read), so ``--seq-len=8`` and ``--seq-len 8`` are the same option and an option given at
its default is no change. Only what makes a run another run is compared (not ``--workers``,
``--quiet``, ``--overwrite``, the executor's options: ``resume.VOLATILE``), and paths as the files
they name (``resume.PATH_OPTIONS``). Each change is said with the values as they were typed.
"""

from __future__ import annotations

from typing import Any

import click

from shardsmith.cli_options import EXECUTOR_PARAMS
from shardsmith.engine.output.resume import PATH_OPTIONS, VOLATILE, resolved


def differences(group: click.Group, before: list[str], now: list[str]) -> list[str] | None:
    """One phrase per option that differs between the arguments ``before`` and ``now`` of ``group``
    (``--seq-len 128 (now 64)``, ``no --nanogpt (now given)``, ``inputs data (now other)``); None
    when they are not the same command, or ``before`` does not parse."""
    then, here = _parsed(group, before), _parsed(group, now)
    if then is None or here is None or then[0] is not here[0]:
        return None
    (_, old, params), new = then, here[1]
    said = []
    for param in params:
        name = param.name
        if name is None or name in VOLATILE or name in EXECUTOR_PARAMS or name not in old or name not in new:
            continue
        a, b = (resolved(v) if name in PATH_OPTIONS else v for v in (old[name], new[name]))
        if a != b:
            said.append((_place(param, now, before),
                         _phrase(param, _typed(param, before, old[name]), _typed(param, now, new[name]))))
    return [phrase for _, phrase in sorted(said, key=lambda s: s[0])]


def _place(param: click.Parameter, now: list[str], before: list[str]) -> int:
    """Where a change is said: the inputs first, then the options in the order this command line gives
    them, then those only the other one gave."""
    if isinstance(param, click.Argument):
        return -1
    for offset, args in ((0, now), (len(now), before)):
        for i, arg in enumerate(args):
            if arg.partition("=")[0] in (*param.opts, *param.secondary_opts):
                return offset + i
    return len(now) + len(before)


def _parsed(group: click.Group, args: list[str]
            ) -> tuple[click.Command, dict[str, Any], list[click.Parameter]] | None:
    """The command ``args`` run, its parameters' values (defaults filled in) and its parameters (a
    ``FormatOptionsCommand``'s: the formats' too); None when it is not a command of ``group``.
    Resilient parsing: a value that does not parse is None, never an error."""
    if not args:
        return None
    ctx = click.Context(group, info_name="shardsmith", resilient_parsing=True)
    command = group.get_command(ctx, args[0])
    if command is None:
        return None
    try:
        with command.make_context(args[0], list(args[1:]), parent=ctx, resilient_parsing=True) as sub:
            return command, dict(sub.params), command.get_params(sub)
    except (click.ClickException, click.exceptions.Exit, ValueError, TypeError):
        return None


def _typed(param: click.Parameter, args: list[str], value: Any) -> list[str] | None:
    """What ``args`` give ``param`` as typed: an argument's values, an option's values (a flag's: []),
    or None when it is not given."""
    if isinstance(param, click.Argument):
        return [str(v) for v in value or ()]
    names = [*param.opts, *param.secondary_opts]
    given: list[str] | None = None
    for i, arg in enumerate(args):
        if arg in names:
            given = (given or []) + ([] if getattr(param, "is_flag", False) else args[i + 1:i + 2])
        elif arg.startswith("--") and arg.partition("=")[0] in names:
            given = (given or []) + [arg.partition("=")[2]]
    return given


def _phrase(param: click.Parameter, then: list[str] | None, now: list[str] | None) -> str:
    """One change, as the two command lines typed it."""
    if isinstance(param, click.Argument):
        return f"{param.name} {' '.join(then or ()) or 'none'} (now {' '.join(now or ()) or 'none'})"
    flag = max(param.opts, key=len)
    if getattr(param, "is_flag", False):
        return f"{flag} (now not given)" if then is not None else f"no {flag} (now given)"
    new = " ".join(now) if now is not None else "not given"
    return f"{flag} {' '.join(then)} (now {new})" if then is not None else f"no {flag} (now {new})"
