"""Preparing the output folder: refuse to mix a new dataset into someone else's files.

A folder without a manifest that holds only shardsmith's files is what a failed or killed run
left. The same command (same options) may take it over and finish; a different one needs
``--overwrite``, so a typo never destroys the half-done work of a long conversion.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
from pathlib import Path

import orjson

from shardsmith import registry
from shardsmith.core import invocation
from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.core.manifest import MANIFEST, RUN_FILE
from shardsmith.core.words import plural
from shardsmith.engine.output.intact import changes, refusal
from shardsmith.engine.output.resume import read_run_file
from shardsmith.errors import UsageError
from shardsmith.kit.writer import piece_files

# What a conversion may leave in its folder, and so what --overwrite removes, is what the installed
# formats declare (``registry.own_files``, ``core/own_files.py``); nothing else is ever removed.


def foreign(out: Path, *, card: bool = True) -> list[str]:
    """The names of the entries of ``out`` that are not shardsmith's (``card``: as ``OwnFiles.ours``)."""
    own = registry.own_files()
    return sorted(p.name for p in out.iterdir() if not own.ours(p, card=card))


def remove_own(out: Path, *, card: bool = True, keep: frozenset[str] = frozenset()) -> None:
    """Remove shardsmith's files from ``out`` (but those named in ``keep``, relative paths), and its
    own folders once they are empty."""
    registry.own_files().remove(out, card=card, keep=keep)


def _finished_shards(out: Path, run: dict[str, str] | None) -> frozenset[str]:
    """The files of the shards a killed run of this very run finished (its scratch folder, which the
    run resumes from, names them in its gather pieces): taken over as they are, not written again
    (the spill they were read from may be released: ``engine/shuffle/release.py``)."""
    work = work_path(out)
    try:
        if run is None or orjson.loads((work / "run.json").read_bytes()) != run:
            return frozenset()
        pieces = [orjson.loads(p.read_bytes()) for p in work.glob("piece-*.json")]
    except (OSError, ValueError):
        return frozenset()
    return frozenset(e["path"] for piece in pieces for e in piece_files(piece) if isinstance(e.get("path"), str))


def prepare_output(out: Path, *, overwrite: bool, run: dict[str, str] | None = None, stage: str | None = None,
                   remake_changed: bool = False) -> bool:
    """Create ``out``; an existing non-empty folder needs ``--overwrite``, which removes the old dataset's files.

    ``run`` (see ``shardsmith.engine.output.resume.run_identity``) is recorded in the folder until the manifest
    is written; the unfinished output of the same command is taken over without ``--overwrite``.
    Returns True when the folder already holds the dataset of this very run (its record, or its
    manifest's ``run``, says so) and ``overwrite`` is not asked: nothing is to be done; unless its
    files changed since (``engine/output/intact.py``), which is a UsageError naming them, or with
    ``remake_changed`` (a staging folder, the run's own) makes it again.
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    if stage == "scatter":  # scatter ranks write only to the scratch folder; the gather prepares ``out``
        return False
    if run is not None and not overwrite and (out / MANIFEST).is_file() and holds_run(out, run):
        # (a cluster rank's folder may hold stand-ins: ``outstages``)
        changed = changes(out) if stage in (None, "prepare") else []
        if not changed:
            return True  # (--overwrite: made again, as asked)
        if not remake_changed:  # complete only while its files are as the manifest lists them
            raise UsageError(refusal(f"-o {out}", changed))
        overwrite = True
    present = sorted(p for p in out.iterdir())
    if stage not in (None, "prepare"):  # gather ranks share the folder: never remove what another rank wrote
        _join(out, present, run=run)
        return False
    if present:
        _clear(out, present, overwrite=overwrite, run=run)
    if run is not None:
        atomic_write_bytes(out / RUN_FILE, orjson.dumps(run))
    return False


def holds_run(out: Path, run: dict[str, str]) -> bool:
    """Whether ``out`` holds this very run's files, finished or not (its record, or its manifest's ``run``)."""
    return run in (read_run_file(out), finished_by(out))


def finished_by(out: Path) -> dict[str, str] | None:
    """The run identity the dataset in ``out`` records, or None: the same command finds its own
    finished dataset even when its run record is gone (killed after the cleanup, or simply run again)."""
    try:
        return run_named((out / MANIFEST).read_bytes())
    except OSError:
        return None


def run_named(manifest: bytes | None) -> dict[str, str] | None:
    """The run identity a manifest's bytes record (its ``run``), or None (none, or not a manifest)."""
    try:
        found = orjson.loads(manifest).get("run") if manifest is not None else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


SHOWN_CHANGES = 4  # the options a refusal names; more are counted


def other_dataset(where: str, manifest: bytes) -> str:
    """The refusal of a finished dataset that another command made (``manifest``: its manifest's
    bytes): the options of this command line that differ from those it was made with, else (a
    library call, or nothing that shows) the command that made it."""
    try:
        command = orjson.loads(manifest).get("command")
    except (orjson.JSONDecodeError, AttributeError):
        command = None
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        command = None
    changed = invocation.differences(command) if command else None
    if changed:
        more = len(changed) - SHOWN_CHANGES
        said = "; ".join(changed[:SHOWN_CHANGES]) + (f"; and {plural(more, 'other')}" if more > 0 else "")
        return f"{where}: holds a finished dataset made with other options: {said}; pass --overwrite to replace it"
    made = f" ({shlex.join(command)})" if command else ""
    return f"{where}: holds a finished dataset that another command made{made}; pass --overwrite to replace it"


def complete_line(where: object, *, left: str | None) -> str:
    """What the same command says of the dataset it finished: ``left``, what it removed of a run
    stopped after its manifest (None: nothing was left)."""
    why = (f"the run that wrote it was stopped after its manifest; removed {left}" if left
           else "this same command finished it; nothing to do")
    return f"{where}: already complete ({why})"


def leftovers(out: Path) -> bool:
    """Whether a run into ``out`` left its record or its scratch folder (it was stopped before its
    cleanup); the listing this very run has just made there is not a leftover."""
    work = work_path(out)
    return (out / RUN_FILE).exists() or (work.exists() and any(p.name != LISTING for p in work.iterdir()))


def work_path(out: Path) -> Path:
    """The scratch folder of a run into ``out``: beside it, on the same filesystem."""
    out = Path(out).resolve()
    return out.parent / f".{out.name}.shardsmith-work"


# inputs staged from object storage (``engine/inputs/url_inputs.py``) and their objects' ETags, in the scratch
# folder: a copy of the inputs, kept when a run starts afresh (each file is checked against its
# object before it is reused) and removed with the scratch folder
STAGED = ("inputs", "inputs.etags")


# a run's listing of one input folder (``engine/inputs/folder_listing.py``), in the scratch folder: written
# before the run claims the folder, so a leftover of another run is replaced, never resumed from
LISTING = "listing"


def listing_path(out: Path) -> Path:
    """Where a run into ``out`` lists its input folder on disk."""
    return work_path(out) / LISTING


def staging_path(out: Path) -> Path:
    """Where inputs named by URL are staged for a run into ``out``."""
    return work_path(out) / STAGED[0]


def drop_staged(out: Path) -> None:
    """Remove the staged inputs and the listing (a run that failed before it claimed the folder),
    and the scratch folder if nothing else is in it."""
    work = work_path(out)
    for name in (*STAGED, LISTING):
        shutil.rmtree(work / name, ignore_errors=True)
    with contextlib.suppress(OSError):
        work.rmdir()


def finish_output(out: Path) -> None:
    """The manifest is written (or the run failed with an error): no run is in progress in the folder.

    Only a run that was killed leaves its record and its scratch folder, so only the same command
    takes over its files and resumes from its finished work.
    """
    shutil.rmtree(work_path(out), ignore_errors=True)
    (out / RUN_FILE).unlink(missing_ok=True)


def _join(out: Path, present: list[Path], *, run: dict[str, str] | None) -> None:
    """A gather or finalize rank joins the output folder of its run: empty, or holding only this
    run's files (its record says so)."""
    if present:
        # by name only: other ranks rename their temporary files meanwhile
        owned = registry.own_files()
        own = all(owned.holds(p.name) is not None or owned.top_file(p.name) for p in present)
        previous = read_run_file(out)
        other = previous is not None and run is not None and previous.get("options") != run["options"]
        if (out / MANIFEST).exists():
            raise UsageError(f"-o {out}: already holds a finished dataset (manifest.json); cluster stages never "
                             f"remove files: give them an empty output folder")
        if not own or other:
            raise UsageError(f"-o {out}: holds other files than this run's (another command's output); cluster "
                             f"stages never remove files: give them an empty output folder")
        if previous == run:
            return  # an earlier rank recorded the run
    if run is not None:
        atomic_write_bytes(out / RUN_FILE, orjson.dumps(run))


def _clear(out: Path, present: list[Path], *, overwrite: bool, run: dict[str, str] | None) -> None:
    """Take the folder over: a dataset card only where a dataset or a run record says so (``card``):
    a ``README.md`` alone in a folder is the user's."""
    owned = registry.own_files()
    card = (out / MANIFEST).exists() or read_run_file(out) is not None
    foreign = owned.foreign(out, card=card)  # what is not shardsmith's (its files are the user's)
    same = False
    if not foreign and not (out / MANIFEST).exists() and not overwrite:
        previous = read_run_file(out)
        same = previous is not None and run is not None and previous.get("options") == run["options"]
        if not same and previous is not None:
            raise UsageError(f"-o {out}: holds the unfinished output of a different command "
                             f"({previous.get('command', '?')} with other options); rerun that command to finish "
                             f"it, or pass --overwrite to replace it")
        overwrite = True  # the same command's unfinished output (or one from before run files): take it over
    made = None if overwrite else finished_by(out)
    if run is not None and made is not None and made.get("options") == run["options"]:
        raise UsageError(f"-o {out}: holds the dataset this same command made from other inputs (changed, added "
                         f"or removed since); pass --overwrite to make it again")
    if made is not None:  # (not --overwrite) a finished dataset of other options: say which
        raise UsageError(other_dataset(f"-o {out}", (out / MANIFEST).read_bytes()))
    if not overwrite:
        raise UsageError(f"-o {out}: folder is not empty ({plural(len(present), 'entry')}); pass --overwrite to "
                         f"replace a previous dataset there")
    if foreign:  # refused before anything is removed: the old dataset stays whole beside the user's files
        raise UsageError(f"-o {out}: --overwrite removes only shardsmith's own files; also found {foreign[:3]} "
                         f"(nothing was removed)")
    (out / MANIFEST).unlink(missing_ok=True)  # first, so a half-cleaned folder is never a dataset
    keep = _finished_shards(out, run) if same else frozenset()
    owned.remove(out, card=card, keep=keep)
    left = [name for name in owned.present(out) if name not in keep]
    if left:
        raise UsageError(f"-o {out}: --overwrite removes only shardsmith's own files; also found {left[:3]}")
