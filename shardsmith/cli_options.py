"""What the ``shardsmith`` commands share: the ranges of numeric options, option parsers, the
options of every converting command, the formats' options (``FormatOptionsCommand``), and
``user_errors`` (a mistake in data or options is one line and an exit code, never a traceback).
``cli.py`` holds the commands themselves."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from shardsmith.engine.processes import interrupt
from shardsmith.errors import ShardsmithError
from shardsmith.kit.options import MAX_COUNT, FormatOptions, Option, refusal

# The ranges of numeric options: past them a value is a typo, and would overflow what is made of it
# (MAX_COUNT and MAX_INT32, shared with the formats' options, are in kit/options.py)
MAX_SEED = (1 << 64) - 1  # a 64-bit seed, as the manifest stores it
MAX_WORKERS = 1024
MAX_RANKS = 1 << 20
MAX_COPIES = 10_000


class Registered(click.Choice):
    """The names the registry holds, plugins' too, listed when click first asks (help or a check)."""

    def __init__(self, kind: str) -> None:
        super().__init__([])
        self.kind = kind

    @property  # type: ignore[override]
    def choices(self) -> list[str]:
        from shardsmith import registry

        return registry.to_options() if self.kind == "format" else registry.names(self.kind)

    @choices.setter
    def choices(self, value: Any) -> None:
        pass


def _fail(message: str, code: int) -> None:
    click.echo(f"shardsmith: error: {message}", err=True)
    sys.exit(code)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the user's mistakes (bad data, options, full disks) into one line and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            interrupt.started()  # a signal held during start-up is raised here, where it is one line
            return fn(*args, **kwargs)
        except BaseException as exc:
            if isinstance(exc, SystemExit | click.exceptions.Exit):
                raise
            if interrupt.is_interruption(exc):  # whatever a library made of the KeyboardInterrupt
                interrupted(exc)
            if isinstance(exc, ShardsmithError):
                _fail(str(exc), exc.exit_code)
            if isinstance(exc, BrokenPipeError):  # the reader of our output went away (`| head`)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(141)
            if isinstance(exc, OSError):
                where = f"{exc.filename}: " if exc.filename else ""
                _fail(f"{where}{exc.strerror or exc}", 1)
            raise

    return wrapper


def interrupted(exc: BaseException | None = None) -> None:
    """One line, and the exit status of a process ended by the signal (130 Ctrl-C, 143 SIGTERM)."""
    click.echo(f"{interrupt.line_start()}shardsmith: {interrupt.MESSAGE}", err=True)
    sys.exit(interrupt.exit_code(exc))


def size_option(option: str) -> Callable[[click.Context, click.Parameter, Any], int | None]:
    def convert(ctx: click.Context, param: click.Parameter, value: Any) -> int | None:
        from shardsmith.core.sizes import parse_size

        if value is None:
            return None
        try:
            return parse_size(value, option=option)
        except ShardsmithError as exc:
            raise click.BadParameter(str(exc)) from None

    return convert


def _output(ctx: click.Context, param: click.Parameter, value: str) -> Path | str:
    """-o: a URL as given (a path would fold its ``//``), else a path."""
    from shardsmith.core.urls import is_url

    return value if is_url(value) else Path(value)


def _splits(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[tuple[str, float], ...]:
    if not value:  # parse_splits' default, without importing numpy (with splits) while the options are parsed
        return (("train", 1.0),)
    from shardsmith.kit.splits import parse_splits

    try:
        return tuple(parse_splits(value).items())
    except ShardsmithError as exc:  # click names the option itself: "Invalid value for '--split': ..."
        raise click.BadParameter(str(exc).removeprefix("--split: ")) from None


def converting_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every converting command (docs/design.md, "Command line")."""
    options = [
        click.option("-o", "--out", "out", required=True, callback=_output, metavar="FOLDER|URL",
                     help="Output folder, or a prefix in object storage (s3://BUCKET/PREFIX)."),
        click.option("--seed", default=0, show_default=True, type=click.IntRange(0, MAX_SEED), help="Shuffle seed."),
        click.option("--no-shuffle", is_flag=True, help="Keep input order."),
        click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None,
                     help="Worker processes [default: all cores]; never changes the output bytes."),
        click.option("--memory", default="1GB", show_default=True, callback=size_option("--memory"),
                     help="Memory budget of the shuffle; beyond it, samples spill to disk."),
        click.option("--split", "splits", default=None, callback=_splits,
                     help="Named fractions, e.g. train=0.98,val=0.02 (by a hash of each record's identity)."),
        click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
                     help="Stop at the first bad record, or skip it and list it in the manifest."),
        click.option("--retries", type=click.IntRange(0, 100), default=5, show_default=True,
                     help="URL inputs: retry a transient storage error (reset, 5xx, throttling) this many times."),
        click.option("--retry-wait", type=click.FloatRange(0, 60), default=0.5, show_default=True, metavar="SECONDS",
                     help="URL inputs: the n-th retry waits a random time up to SECONDS * 2**(n-1) (at most 20 s)."),
        click.option("--staging", type=click.Path(path_type=Path), default=None, metavar="FOLDER",
                     help="-o URL: make the dataset in FOLDER before it is uploaded [default: under ~/.cache/shardsmith]."),
        click.option("--part-size", default=None, callback=size_option("--part-size"), metavar="SIZE",
                     help="-o URL: the part size of multipart uploads (5MiB..5GiB) [default: 64MiB]."),
        click.option("--limit", type=click.IntRange(1, MAX_COUNT), default=None, help="Read only the first N records."),
        click.option("--overwrite", is_flag=True, help="Replace a previous dataset in the output folder."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bars."),
        click.option("--executor", type=click.Choice(["local", "dask", "ray", "slurm"]), default="local",
                     show_default=True, help="Where the units run: here, or on a Dask or Ray cluster, or as SLURM "
                     "jobs (each an extra: shardsmith[dask]...); the bytes are the same."),
        click.option("--ranks", type=click.IntRange(1, MAX_RANKS), default=None,
                     help="dask, ray, slurm: scatter and gather units [default: the cluster's cores; slurm: 4]."),
        click.option("--address", default=None, metavar="ADDR",
                     help="The cluster to join: dask tcp://HOST:PORT [default: a local cluster]; ray auto or "
                          "HOST:PORT [default: a Ray started for the run]."),
        click.option("--no-wait", is_flag=True, help="slurm: submit and print the job ids, without waiting."),
        click.option("--slurm-arg", "slurm_args", multiple=True, metavar="ARG",
                     help="slurm: an sbatch option for every job, e.g. --slurm-arg=--partition=cpu (repeatable)."),
        click.option("--stage", type=click.Choice(["scatter", "plan", "gather", "finalize"]), default=None,
                     help="Clusters: run one stage (scatter on every rank, plan once, gather on every rank, "
                          "then finalize once; plan with the gather's --world-size) [default: all four, here]."),
        click.option("--rank", type=click.IntRange(0, MAX_RANKS - 1), default=None,
                     help="This rank [default: $SLURM_ARRAY_TASK_ID, else $JOB_COMPLETION_INDEX, else $RANK, else 0]."),
        click.option("--world-size", type=click.IntRange(1, MAX_RANKS), default=None,
                     help="Ranks in all [default: $SLURM_ARRAY_TASK_COUNT, else $WORLD_SIZE, else 1]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def declared_options(options: Sequence[Option]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Click options made from declared ones (``kit/options.py``), in their order: a command whose
    flags a format declares (``pack-tokens``: ``formats/tokens/options.PACK_TOKENS``) spells none of
    them itself, so its help, checks and defaults are the declaration's, as ``convert --to``'s are."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for o in reversed(options):
            decls, attrs = _option_spec(o)
            fn = click.option(*decls, **attrs)(fn)
        return fn

    return decorate


def cleaning_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options of commands that read documents of text: dedup, decontamination, the removed list (text/cleaning.py)."""
    options = [
        click.option("--dedup", type=click.Choice(["exact", "exact:raw", "minhash"]), default=None,
                     help="Drop documents equal (exact: after NFKC, case-folding and whitespace; exact:raw: as "
                          "they are) or similar (minhash) to an earlier one; the first in input order stays."),
        click.option("--dedup-threshold", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.8,
                     show_default=True, help="--dedup minhash: the estimated Jaccard of word 5-grams that joins two "
                                             "documents."),
        click.option("--decontaminate", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
                     help="Drop documents sharing a word n-gram with an item of FILE (JSONL or text, one item a "
                          "line; repeatable)."),
        click.option("--decontaminate-ngram", type=click.IntRange(1, 1000), default=13, show_default=True,
                     metavar="N", help="Words per n-gram of --decontaminate (shorter items match whole)."),
        click.option("--decontaminate-field", default="text", show_default=True, metavar="FIELD",
                     help="The JSON field of a --decontaminate JSONL item."),
        click.option("--removed", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help="Write every dropped document (file, line, rule, what it matched) to FILE as JSONL."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


# the executor's options: where a run's units run, never what they make (not part of the run's identity)
EXECUTOR_PARAMS = frozenset({"executor", "ranks", "address", "no_wait", "slurm_args"})


def take_executor(kw: dict[str, Any], workers: int | None) -> tuple[Any, int]:
    """Pop the executor's options from a command's ``kw``: (the executor, None for a local run; the
    workers of each unit: all cores here, one per unit on a cluster unless ``--workers`` says)."""
    from shardsmith.engine.processes.workers import default_workers

    given = {name: kw.pop(name) for name in EXECUTOR_PARAMS}
    name, ranks = given["executor"], given["ranks"]
    options = {"address": given["address"], "wait": not given["no_wait"], "slurm_args": given["slurm_args"]}
    if name == "local" and ranks is None and options == {"address": None, "wait": True, "slurm_args": ()}:
        return None, workers or default_workers()
    if kw.get("stage") is not None:
        raise click.UsageError(f"--stage runs one unit here; --executor {name} runs every unit of the job")
    from shardsmith.executors.choose import executor_named

    return executor_named(name, ranks=ranks, **options), workers or 1


def cluster_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size) from the options, else SLURM array variables, else torchrun-style ones."""
    def env(*names: str) -> int | None:
        for name in names:
            value = os.environ.get(name, "").strip()
            if value:
                try:
                    return int(value)
                except ValueError:
                    raise click.BadParameter(f"${name}={value!r} is not a number") from None
        return None

    if rank is None:  # a SLURM array task, a Kubernetes Indexed Job's pod, a torchrun-style launcher
        rank = env("SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX", "RANK")
    if world_size is None:
        world_size = env("SLURM_ARRAY_TASK_COUNT", "WORLD_SIZE")
    rank, world_size = rank or 0, world_size or 1
    if not 0 <= rank < world_size:
        raise click.BadParameter(f"rank {rank} is not below the world size {world_size}", param_hint="--rank")
    return rank, world_size


class FormatOptionsCommand(click.Command):
    """A command that also takes every format's options (``kit/options.py``, read through the
    registry from the formats' light modules when click first needs them: help or parsing), shows
    them under a heading per ``--to`` value, refuses one given with another ``--to`` (one line, exit 2)
    and hands the callback the chosen ``--to``'s values as ``format_options``."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        flags = frozenset(p.name for p in params if isinstance(p, click.Option) and p.is_flag and p.name)
        return [*params, *_format_params(_declared(), frozenset(p.name for p in params if p.name), flags)]

    def _format_names(self, ctx: click.Context, declared: tuple[FormatOptions, ...]) -> set[str]:
        """The declared options that are not the command's own (a flag of both is the command's)."""
        own = {p.name for p in super().get_params(ctx)}
        return {n for d in declared for n in d.names()} - own

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        if not ctx.resilient_parsing:
            declared = _declared()
            to = ctx.params.get("to")
            names = self._format_names(ctx, declared)
            given = {n: ctx.params.pop(n) for n in sorted(names) if n in ctx.params}
            for name, value in given.items():
                message = refusal(name, value, to=to or "", declared=declared)
                if message is not None:
                    _fail(message, 2)
            ctx.params["format_options"] = {n: v for n, v in given.items()
                                            if any(n in d.names() for d in declared if d.to == to)}
        return rest

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        declared = _declared()
        params = {p.name: p for p in self.get_params(ctx)}
        names = self._format_names(ctx, declared)
        sections = {"Options": [r for name, p in params.items() if name not in names and (r := p.get_help_record(ctx))]}
        for to in sorted({d.to for d in declared if d.to}):
            seen = dict.fromkeys(n for d in declared if d.to == to for n in d.names() if n in names)
            sections[f"Options for --to {to}"] = [r for n in seen if (r := params[n].get_help_record(ctx))]
        width = min(max((len(term) for rows in sections.values() for term, _ in rows), default=0), 30)
        for heading, rows in sections.items():
            if rows:  # every section's help in one column
                with formatter.section(heading):
                    formatter.write_dl([(term.ljust(width), text) for term, text in rows])


def _declared() -> tuple[FormatOptions, ...]:
    """Every format's declaration; a format named as its ``--to`` first (its options lead the section)."""
    from shardsmith import registry

    found = registry.format_options()
    return tuple(found[name] for name in sorted(found, key=lambda name: (found[name].to != name, name)))


@functools.cache
def _format_params(declared: tuple[FormatOptions, ...], taken: frozenset[str],
                   flags: frozenset[str] = frozenset()) -> list[click.Parameter]:
    """One click option per declared option; one declared differently by two formats, or named as
    an option of the command itself, is left out with a warning line (the first declaration wins).
    A declared flag that the command has as a flag of its own (``--provenance``) is that flag: no
    second one and no warning: the command's value, in its options record, is the format's."""
    chosen: dict[str, Option] = {}
    for d in declared:
        for o in d.options:
            if o.type == "flag" and o.name in flags:
                continue
            first = chosen.setdefault(o.name, o)
            if o.name in taken or first != o:
                click.echo(f"shardsmith: warning: --to {d.to}: {o.flag} is "
                           f"{'an option of the command' if o.name in taken else 'declared otherwise by another format'}"
                           f"; it is left out", err=True)
                if o.name in taken:
                    chosen.pop(o.name)
    return [_click_option(o) for o in chosen.values()]


def _click_option(o: Option) -> click.Option:
    """The click option of a declared option: the same checks and help as one written by hand."""
    decls, attrs = _option_spec(o)
    return click.Option(decls, **attrs)


def _option_spec(o: Option) -> tuple[list[str], dict[str, Any]]:
    """The flags and click attributes of a declared option (one place for ``convert --to``'s and
    ``pack-tokens``' options)."""
    if o.type == "flag":
        return [o.flag], {"is_flag": True, "default": False, "help": o.help}
    shown = {"default": o.default, "show_default": o.default is not None, "metavar": o.metavar, "help": o.help}
    if o.type == "size":
        return [o.flag], {"callback": size_option(o.flag), **shown}
    kind: Any = click.STRING
    bounded = o.low is not None or o.high is not None
    if o.type == "int":
        kind = click.IntRange(None if o.low is None else int(o.low), None if o.high is None else int(o.high)) \
            if bounded else click.INT
    elif o.type == "float":
        kind = click.FloatRange(o.low, o.high) if bounded else click.FLOAT
    elif o.choices:
        kind = click.Choice(list(o.choices))
    return [o.flag], {"type": kind, **shown}
