"""The life of one converting run into its output folder, in one place for every command.

1. Lock the output (``outlock``): one writer per folder, for the whole run.
2. Claim the folder (``outdir.prepare_output``): refuse another command's files, take over the
   same command's unfinished output; a dataset this very command already finished (its manifest
   records the run's identity: killed after the manifest, before or after the cleanup, or simply
   run again) is reported complete.
3. Commit: the manifest is written last, then the run's record and scratch folder are removed.

A run that *fails* (bad data, bad options) releases what it claimed, so the corrected command is
never refused: its run record and scratch folder go, and an output folder it created is removed
when only its own files are in it. A run that is *interrupted* (Ctrl-C, SIGTERM) or loses a worker
keeps everything: the same command resumes from its finished parts.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.faults import crash_point
from shardsmith.engine.output.outdir import (
    complete_line,
    drop_staged,
    finish_output,
    leftovers,
    prepare_output,
    remove_own,
)
from shardsmith.engine.output.outlock import LockedError, OutputLock
from shardsmith.engine.processes import interrupt
from shardsmith.errors import WorkerDied
from shardsmith.kit import manifest_io


class OutputRun:
    """What a command does to its output folder; made by ``output_run``."""

    def __init__(self, *, out: Path, overwrite: bool, stage: str | None, created: list[Path],
                 quiet: bool = False) -> None:
        self.out = Path(out)
        self.quiet = quiet
        self.overwrite = overwrite
        self.stage = stage
        self.created = created  # folders this run made (deepest last): removed again if it fails
        self.claimed = False
        self.run: dict[str, str] | None = None  # the run's identity (``resume.run_identity``), once claimed

    def claim(self, run: dict[str, str], *, input_bytes: int = 0) -> dict[str, Any] | None:
        """Prepare the folder for the run ``run`` (``resume.run_identity``); returns the manifest
        when the same run already finished it (and removes what its cleanup left), else None.
        ``input_bytes``: what the inputs weigh (a staging folder checks its free space with it)."""
        self.run = run
        left = leftovers(self.out)
        complete = prepare_output(self.out, overwrite=self.overwrite, run=run, stage=self.stage)
        self.claimed = True
        crash_point("claimed")
        if not complete:
            return None
        finish_output(self.out)
        if not self.quiet:
            print(complete_line(self.out, left="what it left" if left else None), file=sys.stderr)
        return manifest_io.load(self.out)

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Write the manifest (the dataset exists from this moment), then clean up the run's state."""
        crash_point("manifest")
        manifest_io.save(self.out, manifest)
        crash_point("committed")
        finish_output(self.out)
        crash_point("cleaned")
        return manifest

    @property
    def lock_stage(self) -> str | None:
        """The stage whose rank slot the folder's lock takes (None: the whole folder is this run's,
        as while an executor's first unit prepares it)."""
        return None if self.stage == "prepare" else self.stage

    def localize(self, opts: Any) -> Any:
        """The command's options for the local pipeline: unchanged (``outremote`` names its staging folder)."""
        return opts

    def done(self) -> None:
        """The command's work ended without an error (a cluster stage shares what it made: ``outstages``)."""

    def close(self) -> None:
        """The run ends, whichever way: stop what it runs in the background (nothing, locally)."""

    def abandon(self) -> None:
        """The run failed: leave nothing that would refuse the corrected command."""
        if self.lock_stage is not None:
            return  # cluster ranks share the folder: a failed rank is rerun alone (an executor's prepare
            # unit holds the whole folder, as a local run does)
        if not self.claimed:
            drop_staged(self.out)  # inputs it staged before it failed (the folder may be another run's)
            return
        finish_output(self.out)
        if self.out in self.created and not (self.out / manifest_mod.MANIFEST).exists():
            with contextlib.suppress(OSError):
                remove_own(self.out)


def missing(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, outermost first: the folders a run into
    ``path`` makes, removed again (when empty) if it fails."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing[::-1]


@contextlib.contextmanager
def output_run(*, out: Path, overwrite: bool, stage: str | None = None, rank: int = 0,
               quiet: bool = False) -> Iterator[OutputRun]:
    """Lock ``out`` for the run, and release (or keep) what the run claimed when it ends."""
    out = Path(out).absolute()
    created = missing(out)
    session = OutputRun(out=out, overwrite=overwrite, stage=stage, created=created, quiet=quiet)
    with held(session, rank=rank) as s:
        yield s


@contextlib.contextmanager
def held(session: OutputRun, *, rank: int = 0) -> Iterator[OutputRun]:
    """The run of ``session``, holding the lock of its (local) output folder: a failed run releases
    what it claimed, an interrupted one keeps it for the same command to resume."""
    lock = OutputLock(out=session.out, stage=session.lock_stage, rank=rank).acquire()
    failed = False
    try:
        yield session
        session.done()
    except BaseException as exc:
        failed = not (interrupt.is_interruption(exc) or isinstance(exc, WorkerDied))
        if failed:
            session.abandon()
        raise
    finally:
        session.close()
        lock.release()
        if failed and session.lock_stage is None:
            _remove_empty(session.created)


def release_failed(out: Path, *, created: list[Path]) -> bool:
    """A failed run whose units ran in other processes (an executor's: its prepare unit claimed
    ``out``; the unit that failed, and the others, have ended): release what it claimed, as a failed
    local run does (``held``): the run record and scratch folder removed, the output folder too if
    this run made it (``created``: ``missing(out)`` before the run) and only this run's files are in
    it, the lock file gone. Returns False, touching nothing, while another process holds the folder
    (a unit a cluster could not stop, or another run): its files stay, and the same command takes
    them over."""
    session = OutputRun(out=Path(out).absolute(), overwrite=False, stage=None, created=created)
    session.claimed = True
    try:
        lock = OutputLock(out=session.out).acquire()
    except LockedError:
        return False
    try:
        session.abandon()
    finally:
        lock.release()
        _remove_empty(created)
    return True


def _remove_empty(created: list[Path]) -> None:
    """The folders a failed run made (outermost first), removed if empty: never another's file."""
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()
