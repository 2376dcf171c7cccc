"""A run whose output is a prefix in object storage (``-o s3://bucket/prefix``).

The unchanged local pipeline writes into a local *staging* folder (``--staging DIR``, by default
one under the user's cache keyed by the output URL); its finished files are uploaded while the
conversion goes on (``upload.Uploader``), and the manifest goes last: an object store has no
rename, so the manifest's presence is the commit point. Then the run record goes, and the staging
folder with it.

The checks of a local output folder hold on the prefix (``claim_prefix``): a finished dataset or
other objects need ``--overwrite`` (which deletes only shardsmith's objects, the manifest first,
and aborts the unfinished uploads of their names); another command's unfinished output is refused;
the same command takes it over and resumes: objects whose size and checksum match its files stay,
and the parts of an unfinished multipart upload are reused. The run record is the prefix's lease
(``outhold``): a live run's prefix is refused to any other, ``--overwrite`` or not; it is taken
with a conditional put, so of two runs that claim the prefix at once one is refused; and it is
checked to be still this run's immediately before the manifest.

A lease alone cannot stop a run that was frozen (SIGSTOP, a VM paused) past its heartbeat while
another run took the prefix over: when it continues, its requests are already under way. So its
writes are fenced by the store itself (``storage/s3store.py``): objects are created with
``If-None-Match: *`` and replaced or removed with ``If-Match`` the ETag the run knows, and the
manifest is committed through an upload opened before the claim, which every later claim aborts.
A run that lost its prefix can then add an object under a name the new run has not written yet
(the new run replaces it, conditionally, or leaves it outside its manifest), but it can neither
put bytes over the new run's objects nor commit a manifest.

Claiming (``claim_prefix``, the rules of ``outdir.prepare_output`` on a listing): an empty prefix is
claimed; what ``--overwrite`` deletes is shardsmith's own (``registry.own_files``: what every run
leaves and what each installed format declares, ``Format.own_files``; an object in a format's own
folder, ``__index__/`` or a shard written as a folder, is the format's when the folder's declaration
holds it; anything else is foreign), and a prefix holding a foreign object is refused before
anything is deleted. A prefix with
a manifest *and* this run's record is this very run, killed after its manifest: it is reported
complete and the record removed. Before any input is staged, the checks that need no run identity
are made (``refuse_prefix``: a finished dataset, other objects), so a refused run downloads nothing.

Commit: the manifest is uploaded last, after every file and after the prefix's stale objects (an
earlier run's files this one did not make) are deleted and unfinished uploads aborted: those found
at the claim (a dead run's), those this run began, and any under the names of its objects (a create
retried after its answer was lost); never another's under other names (another tool's, or begun
after the claim). The manifest's bytes are the local manifest's. Resume: a killed run leaves the
staging folder, its scratch folder and the run record; the same command resumes the local pipeline
(or finds it committed locally and only publishes), and what is in the bucket already is not
uploaded again (``storage/s3store.py``).

Errors: every call goes through ``retry.call``; ``objstore.storage_errors`` turns the client's
errors into one line naming the URL without credentials: while claiming, exit 2 (no such bucket,
access denied, an endpoint that does not answer after the retries), later exit 1. A URL with
userinfo is refused; a missing s3fs is one line naming ``shardsmith[s3]``. A run that fails (bad
data) removes its run record, and what it uploaded when the prefix was empty, so the corrected
command is not refused. An upload that fails after its retries is not the data's fault: the run
stops in one line (exit 1) and keeps everything, as after a kill; the same command uploads the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import orjson

from shardsmith import registry
from shardsmith.core.faults import crash_point
from shardsmith.core.manifest import MANIFEST, RUN_FILE
from shardsmith.core.own_files import OwnFiles
from shardsmith.core.progress import Progress
from shardsmith.core.sizes import format_size
from shardsmith.core.urls import safe_url
from shardsmith.core.words import plural
from shardsmith.engine.output.intact import listing_changes, refusal
from shardsmith.engine.output.outdir import (
    complete_line,
    finish_output,
    foreign,
    holds_run,
    other_dataset,
    prepare_output,
    remove_own,
    run_named,
)
from shardsmith.engine.output.outhold import Hold, describe, parse, refuse_live, same_run, taken_over
from shardsmith.engine.output.outlock import LockedError
from shardsmith.engine.output.session import OutputRun
from shardsmith.errors import DataError, ShardsmithError, UsageError
from shardsmith.kit import manifest_io
from shardsmith.storage import retry
from shardsmith.storage.objstore import MAX_PART, MIN_PART, PART_SIZE, Changed, ObjectInfo, Store
from shardsmith.storage.stores import open_store
from shardsmith.storage.upload import Uploader

# where the ranks of cluster stages share their work, below the output prefix (``outstages``)
WORK_PREFIX = ".shardsmith-work"


def staging_folder(url: str, staging: Path | None) -> Path:
    """Where the dataset of ``url`` is made before it is uploaded: ``staging``, else a folder under
    the user's cache named after the URL (the same URL resumes from the same folder)."""
    if staging is not None:
        return Path(staging).absolute()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    shown = safe_url(url).rstrip("/")
    key = hashlib.sha256(shown.encode()).hexdigest()[:16]
    name = shown.rsplit("/", 1)[-1] or "dataset"
    return cache / "shardsmith" / "outputs" / key / name


def owned() -> OwnFiles:
    """Which objects of a prefix shardsmith writes (in a format's own folder too; never the work
    prefix): what the installed formats declare (``registry.own_files``); ask it once per listing."""
    return registry.own_files()


def _record(store: Store) -> dict[str, Any] | None:
    return parse(store.read(RUN_FILE))


def claim_prefix(store: Store, run: dict[str, str], *, overwrite: bool, hold: Hold,
                 commit: str | None = None) -> dict[str, ObjectInfo] | None:
    """Check the prefix as ``outdir.prepare_output`` checks a folder, and take its run record
    (``hold``, this run's: ``outhold``); returns what the prefix holds for the run to resume
    against, or None when this very run already finished it (its manifest is there: killed before
    it removed its record). ``commit``: this run's manifest upload (``Store.open_commit``), opened
    before the record is taken; every other run's is aborted once it is taken."""
    present = store.list()
    shown = store.url
    found = store.read_tagged(RUN_FILE) if RUN_FILE in present else None
    previous = parse(found[0]) if found else None
    refuse_live(store, previous)  # a live run's prefix, --overwrite or not
    if MANIFEST in present and not overwrite and (same_run(previous, run) or finished_by(store) == run):
        changed = listing_changes(store.read(MANIFEST), present)  # complete only as it was made
        if changed:
            raise UsageError(refusal(f"-o {shown}", changed))
        return None  # (--overwrite: made again, as asked)
    refuse_prefix(store, present, overwrite=overwrite, record=False)  # (a manifest of this very run: above)
    takeover = False
    if present and all(map(owned().owns, present)) and MANIFEST not in present and not overwrite:
        if previous is not None and previous.get("options") != run["options"]:
            raise UsageError(f"-o {shown}: holds the unfinished output of a different command "
                             f"({previous.get('command', '?')} with other options); rerun that command to finish "
                             f"it, or pass --overwrite to replace it")
        takeover = True  # the same command's unfinished output: keep what matches, resume
    # unfinished uploads of our names, listed before the record is taken: never a later holder's
    before = {rel: [i for i in ids if i != commit] for rel, ids in leftover_uploads(store).items()}
    # the record first (a conditional put): of two runs that claim the prefix at once, one wins
    if not hold.take(found[1] if found else None):
        other = hold.lost or {}
        raise LockedError(f"-o {shown}: another run started writing into this prefix at the same moment"
                          f"{': ' + describe(other) if other.get('token') else ''}; wait for it to finish")
    note = taken_over(previous)
    if note:
        print(f"{shown}: {note}", file=sys.stderr)
    # the runs that held the prefix before can commit nothing from now on: their manifest uploads are
    # aborted, and a manifest one of them completed meanwhile is removed (first: a half-cleared prefix
    # is never a dataset)
    store.abort(MANIFEST, before.pop(MANIFEST, []))
    late = store.head(MANIFEST)
    clear(store, hold, {MANIFEST: late.etag} if late is not None else {})
    if not takeover:  # --overwrite (or nothing there): only what was listed, as it was listed
        clear(store, hold, {rel: info.etag for rel, info in present.items() if rel not in (MANIFEST, RUN_FILE)})
        present = {}
        for rel, ids in before.items():  # a replaced dataset's unfinished uploads: no live run holds the prefix
            store.abort(rel, ids)
    return {rel: info for rel, info in present.items() if rel not in (RUN_FILE, MANIFEST)}


def clear(store: Store, hold: Hold, known: dict[str, str]) -> None:
    """Remove the objects named, each only if it still has the ETag given (``Store.delete_known``).
    One that changed meanwhile was put by a run that lost the prefix, or this run lost it: the
    record says which (``Hold.check`` raises in the second case); the first is removed as it is now."""
    for _ in range(3):
        changed = store.delete_known(known)
        if not changed:
            return
        hold.check()
        known = {rel: now.etag for rel in changed if (now := store.head(rel)) is not None}
    raise DataError(file=store.url, reason=f"{len(known)} objects changed again each time they were removed "
                                           f"(another writer?): {sorted(known)[:3]}")


def finished_by(store: Store) -> dict[str, str] | None:
    """The run identity the prefix's manifest records (``outdir.finished_by`` of a folder), or None."""
    return run_named(store.read(MANIFEST))


def leftover_uploads(store: Store) -> dict[str, list[str]]:
    """The prefix's unfinished multipart uploads of shardsmith's own names (never another tool's)."""
    own = owned()
    return {rel: ids for rel, ids in store.uploads().items() if own.owns(rel)}


def refuse_prefix(store: Store, present: dict[str, ObjectInfo], *, overwrite: bool, record: bool) -> None:
    """The checks that need no run identity (made before any input is staged, and again at the
    claim): a finished dataset or another's objects need --overwrite, which never deletes those."""
    own = owned()
    foreign = sorted(rel for rel in present if not own.owns(rel))
    if present and not overwrite and (foreign or MANIFEST in present and not record):
        if MANIFEST in present and not foreign:  # made by another command: say what differs
            raise UsageError(other_dataset(f"-o {store.url}", store.read(MANIFEST) or b""))
        what = "a finished dataset (manifest.json)" if MANIFEST in present else plural(len(present), "object")
        raise UsageError(f"-o {store.url}: the prefix holds {what}; pass --overwrite to replace a previous "
                         f"dataset there")
    if foreign and overwrite:
        raise UsageError(f"-o {store.url}: --overwrite removes only shardsmith's own objects; also found "
                         f"{foreign[:3]}{' …' if len(foreign) > 3 else ''}")


class RemoteOutputRun(OutputRun):
    """What a command does to an output prefix: a local run into the staging folder, published."""

    def __init__(self, *, url: str, store: Store, staging: Path, overwrite: bool, created: list[Path],
                 quiet: bool = False) -> None:
        super().__init__(out=staging, overwrite=overwrite, stage=None, created=created, quiet=quiet)
        self.url = store.url
        self.store = store
        self.uploader: Uploader | None = None
        self.fresh = False  # the prefix was empty: a failed run removes what it uploaded
        self.keep = False  # an upload failed after its retries: the rerun resumes, as after a kill
        self.hold: Hold | None = None  # the run record as this run's lease on the prefix (``outhold``)
        self.inherited: set[str] = set()  # unfinished uploads found at the claim (a dead run's): ours to end
        self.commit_id: str | None = None  # the upload that commits the manifest (``Store.open_commit``)

    def localize(self, opts: Any) -> Any:
        return dataclasses.replace(opts, out=self.out, out_url=self.url)

    def claim(self, run: dict[str, str], *, input_bytes: int = 0) -> dict[str, Any] | None:
        free = shutil.disk_usage(self.out).free
        if input_bytes > free:  # the dataset is about the size of its inputs (tokens: about half)
            raise UsageError(f"-o {self.url}: the dataset is made in {self.out} before it is uploaded, which needs "
                             f"about {format_size(input_bytes)} (the size of the inputs); {format_size(free)} is free "
                             f"there: choose another place with --staging")
        others = foreign(self.out)
        if others:
            raise UsageError(f"-o {self.url}: the staging folder {self.out} holds other files than shardsmith's "
                             f"({', '.join(others[:3])}); give --staging an empty folder")
        self.run = run
        hold = self.hold = Hold(self.store, run)  # (before the claim: one that fails after taking it lets go)
        self.commit_id = self.store.open_commit(MANIFEST)  # before the record: a later claim aborts it
        try:
            present = claim_prefix(self.store, run, overwrite=self.overwrite, hold=hold, commit=self.commit_id)
        except BaseException:
            self._end_commit()
            raise
        self.claimed = True
        if present is None:
            self._end_commit()
            found = self.store.read_tagged(RUN_FILE)
            left = found is not None and same_run(parse(found[0]), run)
            if left and hold.take(found[1]):  # the dead run's record, only if no other run took it meanwhile
                hold.drop()
            self._drop_staging()
            if not self.quiet:
                print(complete_line(self.url, left="its run record" if left else None), file=sys.stderr)
            return orjson.loads(self.store.read(MANIFEST) or b"{}")
        self.fresh = not present
        self.inherited = {i for ids in leftover_uploads(self.store).values() for i in ids} - {self.commit_id}
        # the staging folder is this URL's alone: anything in it is an earlier run's into the prefix, taken
        # over when it is this same command's (its finished shards kept, a finished dataset published as it is)
        complete = prepare_output(self.out, overwrite=self.overwrite or not holds_run(self.out, run), run=run,
                                  remake_changed=True)
        crash_point("claimed")
        self.uploader = Uploader(store=self.store, folder=self.out, remote=present, own=registry.own_files(),
                                 held=lambda: hold.lost is None, fence=hold.check).start()
        if complete:  # made and committed locally; killed while it was published
            return self._publish(manifest_io.load(self.out))
        return None

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        crash_point("manifest")
        manifest_io.save(self.out, manifest)
        crash_point("committed")
        return self._publish(manifest)

    def _publish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Every file up, then the manifest (the dataset exists from that moment), then the record."""
        assert self.uploader is not None
        try:
            self._upload_all()
        except LockedError:
            raise
        except ShardsmithError as exc:  # the store failed us, not the data: keep everything for a rerun
            if self.hold is not None and self.hold.lost is not None:
                self.hold.check()  # (an upload stopped because the prefix is another run's now)
            self.keep = True
            raise DataError(file=self.url, reason=f"uploading failed ({exc}); the dataset is made: run the same "
                                                  f"command again to upload the rest") from None
        self._drop_staging()
        return manifest

    def _upload_all(self) -> None:
        assert self.uploader is not None and self.hold is not None
        names = self.uploader.finish()
        self.hold.check()  # before anything is deleted: the prefix is still this run's
        Progress(quiet=self.quiet).note(f"{self.url}: {self.uploader.sent:,} of {plural(len(names), 'file')} uploaded "
                                        f"({len(names) - self.uploader.sent:,} were there already); the manifest last")
        # an earlier run's files this one did not make (or made and removed again): as this run knows them
        # (listed at its claim, or written by it), and only if they still are (``clear``)
        own = self.uploader.own
        clear(self.store, self.hold, {rel: info.etag for rel, info in self.uploader.remote.items()
                                      if own.owns(rel) and rel not in names and rel not in (RUN_FILE, MANIFEST)})
        # unfinished uploads: a dead run's found at the claim, this run's, and any left under the names of
        # its objects (a create retried after its answer was lost); never another's under other names
        mine = self.inherited | self.store.started
        for rel, ids in self.store.uploads().items():
            self.store.abort(rel, ids if rel in names else [i for i in ids if i in mine])
        crash_point("uploaded-all")
        self.hold.check()  # immediately before the manifest: a run that lost its prefix commits nothing
        self._commit((self.out / MANIFEST).read_bytes())
        crash_point("published")
        self.hold.drop()

    def _commit(self, data: bytes) -> None:
        """The manifest through the upload opened at the claim (``Store.commit``): refused to a run
        whose prefix was taken over, even one frozen right after its check. A manifest found there
        while the prefix is still ours (a run that lost it committed just before it was taken over)
        is removed, once, and ours committed."""
        try:
            self.store.commit(MANIFEST, self.commit_id, data)
        except Changed:
            assert self.hold is not None
            self.hold.check()  # the prefix is another run's: stop, nothing committed
            there = self.store.head(MANIFEST)
            clear(self.store, self.hold, {MANIFEST: there.etag} if there is not None else {})
            self.store.commit(MANIFEST, self.commit_id, data)
        self.commit_id = None

    def _end_commit(self) -> None:
        """The manifest upload opened at the claim, aborted (the run stops, or has nothing to commit)."""
        if self.commit_id is not None:
            with contextlib.suppress(Exception):
                self.store.abort(MANIFEST, [self.commit_id])
            self.commit_id = None

    def _drop_staging(self) -> None:
        """The staging folder's dataset files and run state (never another file of a --staging folder)."""
        finish_output(self.out)
        with contextlib.suppress(OSError):
            remove_own(self.out)
            self.out.rmdir()

    def abandon(self) -> None:
        """The run failed: the corrected command must not be refused, on the prefix or locally (a
        prefix lost to another run is that run's: left alone)."""
        if self.uploader is not None:
            self.uploader.close()
        if self.keep:
            self.close()
            return
        self._end_commit()
        if self.claimed and self.hold is not None and self.hold.etag is not None:
            with contextlib.suppress(Exception):
                # only while the prefix is still ours, asked now (the record rewritten): an ETag names
                # bytes, not who put them, and a run that took the prefix over may have put the very
                # same bytes (the same command); a fresh prefix: what this run put, as it put it
                if self.hold.refresh():
                    written = self.uploader.remote if self.uploader is not None and self.fresh else {}
                    own = owned()
                    self.store.delete_known({rel: info.etag for rel, info in written.items()
                                             if own.owns(rel) and rel not in (MANIFEST, RUN_FILE)})
                    self.hold.drop()
        super().abandon()
        if self.claimed:
            self._drop_staging()

    def close(self) -> None:
        """Stop the uploads; a hold still held (interrupted, or an upload failed) is released:
        the record stays, without a holder, for the same command to resume."""
        if self.uploader is not None:
            self.uploader.close()
        self._end_commit()
        if self.hold is not None:
            self.hold.release()


def output_store(*, url: str, retries: int, retry_wait: float, part_size: int | None) -> Store:
    """The store of an output URL, its part size checked (the filesystem it needs, too)."""
    if part_size is not None and not MIN_PART <= part_size <= MAX_PART:
        raise UsageError(f"--part-size: S3 takes parts of 5MiB to 5GiB, got {part_size} bytes")
    size = int(os.environ.get("SHARDSMITH_PART_SIZE") or part_size or PART_SIZE)  # the variable: tests only
    return open_store(url, policy=retry.Policy(retries=retries, wait=retry_wait), part_size=size)


def remote_session(*, url: str, staging: Path | None, overwrite: bool, quiet: bool, store: Store) -> RemoteOutputRun:
    """The session of a run into ``url`` (the prefix's checks made before inputs are staged)."""
    present = store.list()
    if any(rel.startswith(WORK_PREFIX + "/") for rel in present):
        raise UsageError(f"-o {store.url}: holds the unfinished work of cluster stages ({WORK_PREFIX}/); finish them "
                         f"(--stage finalize) or remove the prefix")
    refuse_live(store, _record(store) if RUN_FILE in present else None)
    # a record, or a manifest that names its run: whether it is this run's is known at the claim
    mine = RUN_FILE in present or MANIFEST in present and not overwrite and finished_by(store) is not None
    refuse_prefix(store, present, overwrite=overwrite, record=mine)
    local = staging_folder(url, staging)
    return RemoteOutputRun(url=url, store=store, staging=local, overwrite=overwrite, created=[], quiet=quiet)
