"""The scratch folder of a run, beside the output: kept across kills for resume, shared by cluster stages."""


from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import orjson

from shardsmith.engine.output.outdir import LISTING, STAGED, finish_output, work_path
from shardsmith.engine.processes import interrupt
from shardsmith.engine.shuffle.release import spill_lost
from shardsmith.errors import UsageError, WorkerDied


@contextlib.contextmanager
def work_folder(out_dir: Path, *, run: dict[str, str] | None = None, shared: bool = False) -> Iterator[Path]:
    """The spill folder beside the output (``outdir.work_path``), removed when the run ends with an
    error or writes its manifest.

    It is kept when the run is killed or interrupted; the next run of the same command (same
    ``run`` fingerprint: options and unchanged inputs) resumes from its finished part files, any
    other run starts afresh.
    """
    work = work_path(out_dir)
    stamp = work / "run.json"
    if shared:  # cluster stages: ranks share the folder, so it is never removed from under another rank
        _claim_shared(work, stamp, run)
        yield work
        return
    same = False
    if run is not None and stamp.is_file():
        with contextlib.suppress(OSError, ValueError):
            same = orjson.loads(stamp.read_bytes()) == run
    if same and spill_lost(work, out_dir):
        same = False  # a shard made from given-back spill is gone: its bytes can only come from the inputs again
    if work.exists() and not same:
        for entry in work.iterdir():  # not the staged inputs (each is checked against its object before
            # reuse), nor the listing this run has just made
            if entry.name in STAGED or entry.name == LISTING:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    work.mkdir(parents=True, exist_ok=True)
    if run is not None and not same:
        stamp.write_bytes(orjson.dumps(run))
    try:
        yield work
    except BaseException as exc:
        if interrupt.is_interruption(exc) or isinstance(exc, WorkerDied):
            raise  # keep the finished parts: the same command resumes from them
        shutil.rmtree(work, ignore_errors=True)
        finish_output(out_dir)  # a failed run blocks no other command
        raise
    # on success the parts stay until the manifest is written (``outdir.finish_output``): a run
    # killed in between still resumes without reading its inputs again


def _claim_shared(work: Path, stamp: Path, run: dict[str, str] | None) -> None:
    """Join (or create) the scratch folder of a staged run; refuse one that holds another run's parts.

    The stamp is created atomically (a hard link fails if it exists), so ranks starting at the same
    moment agree on it without locks, which cluster filesystems may not have.
    """
    work.mkdir(parents=True, exist_ok=True)
    body = orjson.dumps(run or {})
    tmp = work / f".run.json.tmp-{os.getpid()}-{os.uname().nodename}"
    tmp.write_bytes(body)
    try:
        os.link(tmp, stamp)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    if stamp.read_bytes() != body:
        raise UsageError(f"{work}: holds the parts of a different run (other options or changed inputs); "
                         f"remove that folder to start over")
