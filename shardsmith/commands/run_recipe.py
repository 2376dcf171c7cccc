"""``shardsmith run RECIPE.toml``: one command's saved options, replayed as its command line.

A recipe is a TOML file::

    command = "convert"                       # convert | pack-tokens
    inputs = ["data/train"]                   # paths, relative to the working directory
    out = "shards/train"
    [options]                                 # the command's long options, without the dashes
    to = "webdataset"
    augment = "random-resized-crop=224,hflip"
    no-shuffle = false                        # flags: true / false
    split = { train = 0.98, val = 0.02 }      # tables become name=value,name=value

It runs exactly what the same command line would (same checks, same errors), so a recipe and a
shell history entry never drift apart. ``--set key=value`` overrides an option for one run.

A recipe with a ``[mix]`` table instead describes a training mixture of finished datasets
(``shardsmith.loader.mix_recipe``): ``run`` checks it and prints what it draws; nothing is written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from shardsmith.core.side_file import RECIPE_LIMIT, read_side_text
from shardsmith.errors import UsageError

COMMANDS = ("convert", "pack-tokens")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def load(path: Path) -> dict[str, Any]:
    """The recipe's table, checked: a known command, inputs, an output, options as a table."""
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such recipe")
    text = read_side_text(path, what="recipe", limit=RECIPE_LIMIT)
    try:
        recipe = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not a readable TOML recipe ({exc})") from None
    if "mix" in recipe:
        from shardsmith.loader.mix_recipe import check

        unknown = set(recipe) - {"mix", "description"}
        if unknown:
            raise UsageError(f"{path}: a mix recipe holds [mix] and a description, not {sorted(unknown)}")
        return {"mix": check(recipe["mix"], where=str(path))}
    command = recipe.get("command")
    if command not in COMMANDS:
        raise UsageError(f"{path}: 'command' must be one of {', '.join(COMMANDS)}, got {command!r}")
    inputs = recipe.get("inputs")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
        raise UsageError(f"{path}: 'inputs' must be a path or a list of paths")
    if not isinstance(recipe.get("out"), str):
        raise UsageError(f"{path}: 'out' must be the output folder")
    options = recipe.get("options", {})
    if not isinstance(options, dict):
        raise UsageError(f"{path}: [options] must be a table")
    unknown = set(recipe) - {"command", "inputs", "out", "options", "description"}
    if unknown:
        raise UsageError(f"{path}: unknown keys {sorted(unknown)} (options go in the [options] table)")
    return {"command": command, "inputs": inputs, "out": recipe["out"], "options": dict(options)}


REPEATED = {"--transform"}  # options given once per value; other lists are one comma-separated value


def argv(recipe: dict[str, Any], overrides: tuple[str, ...] = ()) -> list[str]:
    """The command line the recipe stands for."""
    options = dict(recipe["options"])
    out, inputs = recipe["out"], list(recipe["inputs"])
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip().replace("_", "-")
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected key=value")
        if key in ("out", "o"):  # the recipe's own fields are replaced, never given twice
            out = value
        elif key == "inputs":
            inputs = [v for v in value.split(",") if v]
            if not inputs:
                raise UsageError(f"--set {item!r}: give at least one input")
        else:
            options = {k: v for k, v in options.items() if k.replace("_", "-") != key}
            options[key] = _parse_value(value)
    args = [recipe["command"], *inputs, "-o", out]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            args += [flag, ",".join(f"{k}={v}" for k, v in value.items())]
        elif isinstance(value, list) and flag in REPEATED:
            args += [a for v in value for a in (flag, str(v))]
        elif isinstance(value, list):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, str(value)]
    return args


def run(path: Path, overrides: tuple[str, ...], *, dry_run: bool, cli: Any, quiet: bool = False) -> None:
    """``shardsmith run``: the recipe's command line through ``cli`` (the click group), or a
    mixture's summary; ``dry_run`` prints the command line after click has checked every option;
    ``quiet`` runs the command with ``--quiet`` (as the recipe's ``quiet = true`` does)."""
    import shlex

    import click

    recipe = load(path)
    if "mix" in recipe:  # a training mixture: opened, checked and printed (dry or not, nothing is written)
        from shardsmith.loader import mix_recipe

        click.echo(mix_recipe.describe(mix_recipe.build(mix_recipe.override(recipe["mix"], overrides))))
        return
    args = argv(recipe, overrides)
    if quiet and "--quiet" not in args:
        args.append("--quiet")
    if dry_run:
        _check_inputs(path, args[1:args.index("-o")])
        # every option checked as the real run checks it (types, ranges, sizes), nothing run
        ctx = click.get_current_context()
        command = cli.get_command(ctx, args[0])
        assert command is not None
        # named as the user would run it: a usage error says "Try 'shardsmith convert --help'", a command that runs
        with command.make_context(f"shardsmith {args[0]}", list(args[1:])):
            pass
        click.echo("shardsmith " + shlex.join(args))
        return
    if not quiet:
        click.echo("$ shardsmith " + shlex.join(args), err=True)
    cli.main(args=args, prog_name="shardsmith", standalone_mode=True)


def _check_inputs(path: Path, inputs: list[str]) -> None:
    """A dry run says what the real run would find missing first: a local input that is not there
    (a glob that matches nothing), a URL of a scheme inputs cannot be read from or without a bucket
    or server. URLs are only listed by the run itself."""
    from shardsmith.core.globs import is_glob, local_matches
    from shardsmith.core.urls import is_url
    from shardsmith.storage import schemes

    for url in filter(is_url, inputs):
        scheme = schemes.check(url, role="inputs")  # the run's own check of the scheme, and its line
        if not url.partition("://")[2].split("/", 1)[0]:
            raise UsageError(f"{path}: input {url}: names no bucket or server ({scheme.name}://NAME/...)")
    missing = [i for i in inputs if not is_url(i) and not Path(i).exists() and not (is_glob(i) and local_matches(i))]
    if missing:
        raise UsageError(f"{path}: no such input: {', '.join(missing)} (paths are relative to the working "
                         f"directory, {Path.cwd()})")


def _parse_value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return text
