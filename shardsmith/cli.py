"""The ``shardsmith`` command line (click). Each command imports its module only when it runs."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import click

from shardsmith.cli_options import (
    MAX_COPIES,
    MAX_WORKERS,
    FormatOptionsCommand,
    Registered,
    cleaning_options,
    cluster_rank,
    converting_options,
    declared_options,
    interrupted,
    size_option,
    take_executor,
    user_errors,
)
from shardsmith.commands.report import (
    balance_dropped,
    cleaning_dropped,
    inputs_left_out,
    report_skipped,
    report_stage,
)
from shardsmith.core import invocation
from shardsmith.core.images import MAX_IMAGE_PIXELS  # stdlib only: Pillow is not imported
from shardsmith.core.names import not_utf8
from shardsmith.core.user_warning import as_lines
from shardsmith.core.version import __version__
from shardsmith.core.words import plural
from shardsmith.engine.processes import interrupt
from shardsmith.formats.tokens.options import PACK_TOKENS  # (light: the declared options only)
from shardsmith.kit.options import MAX_COUNT, MAX_INT32

# No command does linear algebra, but numpy's OpenBLAS starts a thread per core when it is imported
# and keeps it spinning for a while (0.1 s of a core here), beside the workers; one thread starts none.
# Set before numpy is imported, and only for the command line (``import shardsmith`` leaves it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


class _Main(click.Group):
    """The command group. Run as a program (``shardsmith`` or ``python -m shardsmith``: click's
    ``__call__``), the process ends as soon as the command does, without the interpreter's
    teardown: every file a command writes is flushed and synced before it returns, and freeing a
    conversion's objects one by one takes longer (tens of milliseconds) than listing them took.
    Tests call ``main.main()`` and keep their process."""

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        """Click's entry, the arguments recorded first (``core.invocation``: the manifest's command)."""
        given = sys.argv[1:] if args is None else list(args)
        _refuse_undecodable(given)
        invocation.record(given, differ=self._differences)
        try:
            with as_lines():  # shardsmith's own warnings as the program's other warning lines
                return super().main(args, *rest, **kwargs)
        finally:
            invocation.record(None)  # a library call after this one records its own process's arguments

    def _differences(self, before: list[str], now: list[str]) -> list[str] | None:
        """How the command line ``now`` differs from ``before`` (``core.invocation.differences``)."""
        from shardsmith.cli_changes import differences

        return differences(self, before, now)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        """Click parses the options here, inside its own ``except KeyboardInterrupt`` ("Aborted!"):
        the crash tests' ``SHARDSMITH_STALL_AT=start-up`` waits here (signals are held)."""
        if os.environ.get("SHARDSMITH_STALL_AT") == "start-up":
            from shardsmith.core.faults import crash_point

            crash_point("start-up")
        return super().make_context(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        interrupt.install()
        try:
            try:
                self.main(*args, **kwargs)
            except KeyboardInterrupt as exc:  # (held during start-up: commands catch their own)
                interrupted(exc)
            finally:
                try:
                    interrupt.started()  # no command ran (--help, a usage error): a held signal, said now
                except KeyboardInterrupt as exc:
                    interrupted(exc)
        except SystemExit as exc:
            code = exc.code
        else:  # pragma: no cover - click's standalone mode always ends with SystemExit
            code = 0
        if not isinstance(code, int):
            if code is not None:
                click.echo(code, err=True)
            code = 0 if code is None else 1
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a reader that went away, or a closed stream
                stream.flush()
        os._exit(code)


def _refuse_undecodable(args: list[str]) -> None:
    """An argument that is not valid UTF-8 (a path with stray bytes, which Python holds as
    surrogates) is one line and exit 2: paths are recorded in the run's identity, its lock and its
    manifest, all UTF-8 text."""
    for arg in args:
        if (shown := not_utf8(arg)) is not None:
            click.echo(f"shardsmith: error: {shown}: not valid UTF-8; rename the file or folder (paths are "
                       f"recorded in the manifest, in UTF-8)", err=True)
            sys.exit(2)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="shardsmith")
def main() -> None:
    """Prepare training data offline: exact global shuffle, shards with a manifest, a fast loader."""


@main.command("pack-tokens")
@click.argument("inputs", nargs=-1, required=True)
@declared_options(PACK_TOKENS)  # the tokens format's table: --tokenizer ... --chat ... (formats/tokens/options.py)
@click.option("--transform", "transforms", multiple=True, metavar="NAME[=SPEC]",
              help="A registered transform applied to each row before its text is taken (repeatable).")
@cleaning_options
@converting_options
@user_errors
def pack_tokens(inputs: tuple[str, ...], out: Path, no_shuffle: bool, workers: int | None, **kw: Any) -> None:
    """Tokenize JSONL/Parquet text into exactly shuffled Megatron indexed datasets."""
    from shardsmith.commands.pack_tokens import PackTokensOptions, run, summary_line

    executor, workers = take_executor(kw, workers)
    kw["rank"], kw["world_size"] = cluster_rank(kw.get("rank"), kw.get("world_size"))
    opts = PackTokensOptions(inputs=inputs, out=out, shuffle=not no_shuffle, workers=workers, **kw)
    manifest = run(opts, executor=executor)
    if _report_submitted(out, manifest) or report_stage(out, manifest):
        return
    click.echo(summary_line(out, manifest) + inputs_left_out(manifest["source"]))
    report_skipped(out, manifest["source"])


@main.command(cls=FormatOptionsCommand)
@click.argument("inputs", nargs=-1, required=True)
@click.option("--to", "to", type=Registered("format"), required=True,
              help="Output format; its own options follow, under \"Options for --to FORMAT\".")
@click.option("--from", "source", type=Registered("source"), default=None,
              help="Input kind [default: inferred from the inputs].")
@click.option("--text-field", default=None, help="Also store this JSON field / column as a .txt member "
              "(--to tokens: the text it tokenizes [default: text]).")
@click.option("--check-images", type=click.Choice(["header", "full", "none"]), default="header", show_default=True,
              help="header: magic number, dimensions and JPEG EOI without decoding; full: decode every image.")
@click.option("--max-image-pixels", default=MAX_IMAGE_PIXELS, show_default=True, type=click.IntRange(1, MAX_COUNT),
              help="Images with more pixels are bad records (at check levels header and full, and with --augment); "
                   "the loader and verify --deep use the same limit. Default: Pillow's.")
@click.option("--augment", default=None, metavar="SPEC",
              help='Offline augmentation, e.g. "random-resized-crop=224,hflip" or "resize=256,center-crop=224".')
@click.option("--copies", default=1, show_default=True, type=click.IntRange(1, MAX_COPIES),
              help="Augmented variants per image, each under its own key.")
@click.option("--transform", "transforms", multiple=True, metavar="NAME[=SPEC]",
              help="A registered transform applied to each row, in order (repeatable; see `shardsmith plugins`).")
@click.option("--balance", metavar="max=N|ratio=R[,label=F]", help="Keep <= N (R x the least) per class.")
@click.option("--quality", default=90, show_default=True, type=click.IntRange(1, 100), help="JPEG quality of re-encoded images.")
@click.option("--tree", default=None, help="Events: the ROOT TTree or RNTuple [default: the only one].")
@click.option("--branches", "--columns", "branches", default=None, metavar="GLOBS",
              help='Events: comma-separated globs of branches/columns, e.g. "Jet_*,nJet" [default: every numeric one].')
@click.option("--step-size", default="64MB", show_default=True, callback=size_option("--step-size"),
              help="Events: read at most this much (uncompressed) at a time, so memory stays flat.")
@click.option("--group-by", default=None, metavar="COLUMN",
              help="Parquet events in long format: consecutive rows with the same COLUMN value are one event.")
@click.option("--events-table", default=None, type=click.Path(),
              help="Parquet events: a per-event table joined on --group-by (e.g. train_meta.parquet).")
@click.option("--provenance", is_flag=True,
              help="Events: store each event's input file (index into the manifest's inputs) and entry; "
                   "--to tokens: each document's input file, line or row and byte offset (shardsmith trace).")
@cleaning_options
@converting_options
@user_errors
def convert(inputs: tuple[str, ...], out: Path, no_shuffle: bool, workers: int | None, branches: str | None,
            **kw: Any) -> None:
    """Convert image folders, JSONL, Parquet or ROOT events into exactly shuffled shards (tar, HDF5, or fixed-shape memmap arrays)."""
    from shardsmith.engine.inputs.files import walk_soon

    # a child lists the input folders while this process loads the converter
    with walk_soon(inputs, quiet=kw["quiet"]):
        from shardsmith.commands.convert import ConvertOptions, run, summary_line

        globs = tuple(g.strip() for g in branches.split(",") if g.strip()) if branches else None
        executor, workers = take_executor(kw, workers)
        kw["rank"], kw["world_size"] = cluster_rank(kw.get("rank"), kw.get("world_size"))
        opts = ConvertOptions(inputs=inputs, out=out, shuffle=not no_shuffle, workers=workers, branches=globs, **kw)
        manifest = run(opts, executor=executor)
    if _report_submitted(out, manifest) or report_stage(out, manifest):
        return
    src = manifest["source"]
    if (line := summary_line(opts, out, manifest)) is not None:  # another command's job (--to tokens)
        click.echo(line + inputs_left_out(src))
        report_skipped(out, src)
        return
    parts = ", ".join(f"{name}: {plural(s.get('events', s['samples']), 'event' if 'events' in s else 'sample')} in "
                      f"{plural(len(s['shards']), 'shard')}" for name, s in manifest["splits"].items())
    click.echo(f"{out}: {parts}; {plural(src['records'], 'record')} read, {src['skipped']['count']:,} skipped"
               f"{balance_dropped(manifest)}{cleaning_dropped(manifest)}{inputs_left_out(src)}")
    report_skipped(out, src)


def _report_submitted(out: Path, result: dict[str, Any]) -> bool:
    """One line for jobs submitted without waiting (``--executor slurm --no-wait``): their ids."""
    if "submitted" not in result:
        return False
    from shardsmith.executors.slurm import submitted_line

    click.echo(f"{out}: submitted to SLURM: {submitted_line(result['submitted'], result['ranks'])}; "
               f"done when {out}/manifest.json exists (logs in {result['logs']}/)")
    return True


@main.command()
@click.argument("paths", nargs=-1, required=True, metavar="OUT | URL | INPUT...")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--samples", default=1, show_default=True, type=click.IntRange(0, 10_000), help="Samples to show.")
@click.option("--report", "report", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
              help="Write an HTML report with figures into DIR (needs shardsmith[report]); of a dataset, or of "
                   "raw inputs before any conversion (a seeded sample).")
@click.option("--seq-len", type=click.IntRange(1, MAX_INT32), default=None,
              help="Report: documents longer than this are cut [default: manifest or 1024].")
@click.option("--from", "source", type=Registered("source"), default=None,
              help="Report of raw inputs: their kind [default: inferred from the inputs].")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, MAX_INT32),
              help="Report: the seed of the sample it reads.")
@click.option("--fields", default=None, metavar="A,B,...",
              help="Report of events: the fields to draw [default: every field, up to 24; the table lists all].")
@user_errors
def inspect(paths: tuple[str, ...], as_json: bool, samples: int, report: Path | None, seq_len: int | None,
            source: str | None, seed: int, fields: str | None) -> None:
    """Summary of a dataset's manifest and a few samples (a folder, or a URL the loader reads); with --report,
    an HTML report of a dataset or of raw inputs."""
    from shardsmith.commands.inspect_report import dataset_report, inputs_report, is_dataset
    from shardsmith.core.globs import is_glob
    from shardsmith.core.urls import is_url
    from shardsmith.errors import UsageError

    if fields is not None and report is None:
        raise UsageError("--fields chooses the fields a report draws: give --report DIR too")
    if len(paths) == 1 and is_url(paths[0]) and report is None:  # a dataset at a URL
        from shardsmith.commands.inspect import run as run_inspect

        run_inspect(paths[0], as_json=as_json, samples=samples)
        return
    chosen = tuple(f.strip() for f in fields.split(",") if f.strip()) if fields else None
    if fields is not None and not chosen:
        raise UsageError("--fields: give one field name or more, comma-separated")
    missing = [p for p in paths if not is_url(p) and not Path(p).exists() and not is_glob(p)]  # (globs: discover's)
    if missing:
        raise UsageError(f"{missing[0]}: no such file or folder")
    if not is_dataset(paths):
        if report is None:
            raise UsageError(f"{paths[0]}: not a dataset folder (no manifest.json); to look at raw inputs, "
                             f"give --report DIR")
        inputs_report(paths, report, source=source, seed=seed, fields=chosen)
        return
    if report is not None:
        dataset_report(Path(paths[0]), report, seq_len=seq_len, seed=seed, fields=chosen)
        return
    from shardsmith.commands.inspect import run

    run(Path(paths[0]), as_json=as_json, samples=samples)


@main.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--split", default="train", show_default=True)
@click.option("--seq-len", type=click.IntRange(1, MAX_INT32), default=None, help="Window length [default: manifest or 1024].")
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(1, 1 << 24))
@click.option("--seconds", default=2.0, show_default=True, type=click.FloatRange(0.1, 86400.0))
@click.option("--target-tokens-per-s", "--target-samples-per-s", "target", type=click.FloatRange(0.0, 1e15),
              default=None,
              help="Exit 1 unless the loader reaches this many tokens/s (samples/s for sample datasets).")
@user_errors
def bench(out: Path, split: str, seq_len: int | None, batch_size: int, seconds: float,
          target: float | None) -> None:
    """Loader throughput: tokens/s and batches/s for tokens, samples/s and MB/s for tar shards."""
    from shardsmith.commands.bench import run

    ok = run(out, split=split, seq_len=seq_len, batch_size=batch_size, seconds=seconds, target=target)
    if not ok:
        sys.exit(1)


@main.command()
@click.argument("out", metavar="OUT | URL")
@click.option("--deep", is_flag=True, help="Also open every sample: tar headers and offsets, token ids, images.")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None, help="Files hashed at once [default: all cores].")
@user_errors
def verify(out: str, deep: bool, workers: int | None) -> None:
    """Check every file of a dataset (a folder, or a URL the loader reads) against its manifest (size, sha256);
    exit 1 on any mismatch."""
    from shardsmith.commands.verify import run
    from shardsmith.engine.processes.workers import default_workers

    if not run(out, deep=deep, workers=workers or default_workers()):
        sys.exit(1)


@main.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("index", type=click.IntRange(min=0), required=False)
@click.option("--split", default="train", show_default=True)
@click.option("--seq-len", type=click.IntRange(1, MAX_INT32), default=None,
              help="Window length of a TokenDataset [default: the manifest's].")
@click.option("--state", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="FILE",
              help="A saved loader state (JSON): trace the next batch that loader yields.")
@click.option("--inputs", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
              help="Where the inputs are now [default: where pack-tokens read them].")
@user_errors
def trace(out: Path, index: int | None, split: str, seq_len: int | None, state: Path | None,
          inputs: Path | None) -> None:
    """The documents (input file, line or row, text) of a window or sequence of a pack-tokens --provenance
    dataset, or of the next batch of a saved loader state."""
    from shardsmith.commands.trace import run

    run(out, index, split=split, seq_len=seq_len, state=state, inputs=inputs)


@main.command("run")
@click.argument("recipe", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override an option of the recipe.")
@click.option("--dry-run", is_flag=True, help="Print the command line the recipe stands for, and stop.")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no echoed command line: the command runs with --quiet.")
@user_errors
def run_recipe(recipe: Path, overrides: tuple[str, ...], dry_run: bool, quiet: bool) -> None:
    """Run a recipe: a TOML file holding one command's inputs, output and options (or a training mixture)."""
    from shardsmith.commands.run_recipe import run

    run(recipe, overrides, dry_run=dry_run, quiet=quiet, cli=main)


@main.command()
@user_errors
def plugins() -> None:
    """Installed sources, transforms, formats and record kinds: built-in and from other packages."""
    from shardsmith.commands.plugins import run

    run()


if __name__ == "__main__":
    main()
