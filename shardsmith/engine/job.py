"""A job (what to run) and its units (the pieces any process can run), the seam between "what to
run" and "where it runs" (docs/design.md, "The flow").

A command describes its job: its name, its options record, the source, the transforms, the format,
and its own steps (``JobSteps``: the hooks the engine calls between its own steps). The engine
(``engine/conduct.py``) runs the job: locally every unit in one process, or one unit per process
(``--stage``, a cluster scheduler). A job and its units are plain picklable values: a process that
has them and can see the output folder runs its unit with ``run_unit(job, unit)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsmith.core.file_listing import total_size
from shardsmith.core.input_file import InputFile
from shardsmith.core.memory import no_gc
from shardsmith.engine.inputs import url_inputs
from shardsmith.engine.options import ConvertingOptions
from shardsmith.engine.units import GatherUnit, PlanUnit, PrepareUnit, ScatterUnit, Unit
from shardsmith.kit.format import Format, WriteJob
from shardsmith.kit.options import OptionValues

if TYPE_CHECKING:
    from shardsmith.core.progress import Progress
    from shardsmith.engine.output.session import OutputRun
    from shardsmith.engine.shuffle.run import Converted, Sizing
    from shardsmith.kit.processed import Processor
    from shardsmith.kit.reader import Reader, Task
    from shardsmith.text.cleaning import CleaningSpec


@dataclass(frozen=True, kw_only=True)
class Job:
    """What to run, whole: any process that has it (and the output folder) runs any of its units."""

    command: str  # "convert", "pack-tokens": names the run in its identity (``resume.run_identity``)
    steps: type[JobSteps]  # the command's own steps (a class: picklable, made anew in each process)
    opts: ConvertingOptions  # the options record: the run's, the source's and the format's
    source: str | None = None  # the registered source (None: from the inputs' suffixes, or the steps')
    transforms: tuple[str, ...] = ()  # --transform NAME[=SPEC], in order
    format: str | None = None  # the format's ``--to`` value, or its registry name

    @property
    def out(self) -> Path:
        """The output: a folder, or a URL (``-o s3://...``)."""
        return self.opts.out  # type: ignore[attr-defined,no-any-return]

    def for_unit(self, unit: Unit) -> Job:
        """This job as the process running ``unit`` sees it (its stage, rank and world size)."""
        rank, world = ((unit.rank, unit.world) if isinstance(unit, ScatterUnit | GatherUnit)
                       else (0, unit.world) if isinstance(unit, PlanUnit | PrepareUnit) else (0, self.opts.world_size))
        return dataclasses.replace(self, opts=dataclasses.replace(self.opts, stage=unit.stage, rank=rank,
                                                                  world_size=world))


def write_job(opts: Any, *, schema: Any = None, sources: list[str] | None = None,
              options: OptionValues | None = None) -> WriteJob:
    """What the format's writers are made from (``Format.writer``): the run's options and the format's own."""
    return WriteJob(opts=opts, out=opts.out, schema=schema, sources=sources, options=options or OptionValues(),
                    workers=opts.workers)


class JobRun:
    """One process's run of a job: what the engine and the command's steps found out, step by step."""

    def __init__(self, *, job: Job, opts: Any, session: OutputRun, progress: Progress) -> None:
        self.job = job
        self.opts = opts  # the job's options for the local pipeline (``OutputRun.localize``)
        self.session = session
        self.progress = progress
        self.reader: Reader = None  # type: ignore[assignment]  # set by ``JobSteps.open``
        self.fmt: Format = None  # type: ignore[assignment]
        # the inputs: a list, or (one local folder) a listing on disk read in chunks (``core/file_listing.py``),
        # which only the copy mode keeps past the claim
        self.files: Sequence[InputFile] | None = None
        self.skipped: list[dict[str, str]] = []  # objects ``--on-error skip`` left out while staging
        self.write: WriteJob | None = None  # set by the steps (``make_write``) before any unit runs
        self.sizing: Sizing | None = None
        self.identity: dict[str, str] = {}
        self.tasks: Sequence[Task] = ()
        self.copying = False  # the engine's copy mode (``engine/copying/image_copy.py``): no shuffle pass
        self.cleaning: CleaningSpec | None = None  # what the run cleans (``JobSteps.cleaning``, checked by the engine)

    def discover(self, suffixes: tuple[str, ...]) -> Sequence[InputFile]:
        """The inputs (listed, or staged from a URL), kept as ``files``."""
        with no_gc():
            self.files = url_inputs.discover_inputs(self.opts, suffixes=suffixes)
        return self.files

    def make_write(self, *, schema: Any = None, sources: list[str] | None = None,
                   options: OptionValues | None = None) -> WriteJob:
        """The format's write job, checked by the format before any work."""
        self.write = write_job(self.opts, schema=schema, sources=sources, options=options)
        self.fmt.check(self.write)
        return self.write


@dataclass(frozen=True, kw_only=True)
class Described:
    """What a command adds to the manifest of its finished run (``finish.commit_dataset``)."""

    source: dict[str, Any]
    schema: dict[str, Any]
    extras: dict[str, Any]
    used: tuple[tuple[str, str], ...]
    copies: int = 1
    events: bool = False
    unread: Sequence[dict[str, Any]] = ()
    written: int | None = None
    list_inputs: bool = False


class JobSteps:
    """A command's own steps in the engine's sequence (``engine/conduct.py``), in the order called.
    One instance per process; it may keep what a step found for a later one."""

    desc = "convert"  # the progress bars' name of the work

    def __init__(self, *, job: Job) -> None:
        self.job = job

    def open(self, run: JobRun) -> JobSteps:
        """Set ``run.reader`` and ``run.fmt`` (listing the inputs with ``run.discover`` if choosing
        needs them); return the steps that carry on: these, or those of what was found."""
        raise NotImplementedError

    def check(self, run: JobRun) -> None:
        """Refuse what cannot be converted before any work (options, inputs); may narrow ``run.files``."""

    def extra_inputs(self, run: JobRun) -> tuple[str | None, ...]:
        """Files besides the inputs the output depends on (hashed into the run's identity)."""
        return run.reader.extra_inputs(run.opts)

    def copies_files(self, run: JobRun) -> bool:
        """Whether every record is an input file taken unchanged (the engine's copy mode, when the
        format can take them and the run is local, unlimited and stops at the first bad file)."""
        return False

    def estimated_bytes(self, run: JobRun) -> int:
        """What the shuffle's payloads weigh, about (sizes its buckets)."""
        return total_size(run.files or ())

    def cleaning(self, run: JobRun) -> CleaningSpec | None:
        """What the run cleans and traces of its documents (``text/cleaning.py``; None: nothing)."""
        return None

    def processor(self, run: JobRun) -> Processor:
        """What turns records into payloads (after the claim and the plan: it may read ``run.tasks``)."""
        raise NotImplementedError

    def describe(self, run: JobRun, done: Converted) -> Described:
        """The manifest's fields of this command, for the finished run ``done``."""
        raise NotImplementedError
