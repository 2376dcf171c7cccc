"""Inputs named by URL (``s3://bucket/prefix/``, ``root://host:port//folder/``, one object or file,
or a glob on them), for every command.

The objects are listed (size and ETag: ``storage/listing.py``) and given the identities of a local
copy of the same tree (the path relative to the input root, an image's class folder), so the output
is byte-identical to a run on that copy. The run starts then; the objects are *staged* meanwhile, by a background stager
(``storage/stager.py``) in the order the tasks read them and within a budget ahead of the readers:
downloaded into the run's scratch folder (``outdir.staging_path``), laid out as ``SCHEME/BUCKET/KEY``,
where a reader waits for its file to be whole (``storage/arrival.py``). What planning reads
(``Reader.reads_to_plan``) is waited for before the plan; with ``--on-error skip`` every object is
staged before the run starts, so one that stays unreadable is left out as if it were not there.

Each download goes to a temporary name and is renamed when whole; the object's ETag is written
beside it (``inputs.etags``) afterwards, so a file is reused only when its size and ETag match the
object listed now, and a killed run resumes without downloading again. The run's fingerprint
stands for the objects (URL, size, ETag: ``InputFile.origin``), not for the copies. The staged
files go with the scratch folder when the run ends. URLs are shown without userinfo or query, and
errors of the storage client become one line naming the URL.

Transient errors (a reset connection, 5xx, throttling, timeouts) of the listing and of each
download are retried (``storage/retry.py``, the only layer that retries: s3fs's and botocore's own
retries are turned off); a download that breaks off resumes at the byte it reached, by a ranged
read on a fresh open. An object that stays unreadable stops the run, or with ``--on-error skip`` is
left out and listed (``StagedInputs.skipped``, the manifest's ``source.skipped_inputs``).

Schemes (the one table: ``storage/schemes.py``): ``s3://``; ``root://``; ``http(s)://`` through
aiohttp, where a folder is a page of links named with its slash and an object is named by its
whole URL, its query used to download but never shown, staged or recorded; ``gs://`` through
gcsfs, on the same path (``tests/test_gs_inputs.py``, against gcp-storage-emulator). The identities
are those ``discover`` gives a local tree (``inputs.listed``: the same roots, relative paths, image
classes and order), and the run fingerprint (``resume.run_identity``) uses each object's ``origin``
(URL and ETag) instead of a copy's times. Staged paths are ``inputs/SCHEME/BUCKET/KEY``, or
``inputs/root/HOST:PORT/PATH`` for XRootD, whose version is its size and modification time. A new
run keeps the staged folder (``workdir.work_folder``) and removes at once every file that does not
match its object now, so a file that exists at an input's path is whole. The manifest records
``source.input_root`` (without userinfo or query).

Read in place (``_read_in_place``, the one place that decides): an object is read where it is when
every registered source that reads files of its kind (by suffix) opens URLs of its scheme itself
(``Reader.opens_urls``); its ``InputFile.path`` is then the URL, its identity (``rel``, ``origin``)
the same as when staged, and nothing is downloaded. The ROOT source opens ``root://`` in place
(``sources/root/files.py`` ``URL_SOURCES``): ``uproot.open(url)`` fetches only the baskets of the
branches read (uproot's default source for ``root://``, fsspec-xrootd over the XRootD client
bindings; uproot's own ``XRootDSource`` fails in ``iterate`` against the Debian server, "[3000] Read
vector is invalid", uproot 5.7.7). Measured in ``tests/test_xrootd_inputs.py``: three of ten
branches of a 9.3 MB file, 357 kB read by the server (3.8 %). A file read in place is keyed by its
listed size and ETag in the reader's open-file cache, and ``inputs.changed`` does not stat it (its
listed version stands). Every other source, and ROOT files on S3, read staged copies.

Retries, listing and skips: ``--retries`` and ``--retry-wait`` never change the bytes, so they are
not part of the run fingerprint (``resume._VOLATILE``). **Listing errors always stop the run**,
whatever ``--on-error``: a prefix or glob that stays unlistable after the retries, also when it is
one of several URL inputs, stops with one line. ``--on-error skip`` skips what is known to exist and
cannot be read; an unlistable prefix is a set of inputs nobody knows, so no run could say what it
left out, and a dataset made from "whatever could be listed" would differ from run to run without
its manifest saying how.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from shardsmith.core.file_listing import staged_only
from shardsmith.core.input_file import InputFile
from shardsmith.core.progress import Progress
from shardsmith.core.sizes import format_size
from shardsmith.core.urls import is_url, safe_url
from shardsmith.core.words import plural
from shardsmith.engine.inputs import files as inputs
from shardsmith.engine.output.outdir import STAGED, listing_path, staging_path, work_path
from shardsmith.errors import DataError, UsageError
from shardsmith.storage import listing, retry, schemes
from shardsmith.storage.stager import Stager

BLOCK = 8 << 20  # bytes per ranged read of a download


class StagedInputs(list):  # type: ignore[type-arg]
    """The input files, and the objects ``--on-error skip`` left out (``{"url", "reason"}``)."""

    skipped: list[dict[str, str]]


def skipped_inputs(files: list[InputFile]) -> list[dict[str, str]]:
    return list(getattr(files, "skipped", []))


def discover_inputs(opts: Any, *, suffixes: tuple[str, ...]) -> Sequence[InputFile]:
    """``discover`` with a converting command's options (inputs, output, stage, retries, on-error)."""
    return discover(list(opts.inputs), suffixes=suffixes, out=opts.out, quiet=opts.quiet, stage=opts.stage,
                    retries=opts.retries, retry_wait=opts.retry_wait, on_error=opts.on_error, memory=opts.memory,
                    limit=opts.limit, rank=opts.rank)


_RUNNING: list[Stager] = []


@contextlib.contextmanager
def staging_for_run() -> Iterator[None]:
    """Around a command: the stagers ``discover`` starts in the block stop when it ends (the run is
    done, failed or interrupted), before the command's cleanup removes the staging folder."""
    try:
        yield
    finally:
        stop_staging()


def stop_staging() -> None:
    """Stop this process's stagers: the run has read what it needs (a ``--limit`` run's stager may
    still be fetching ahead), and its scratch folder is about to go."""
    while _RUNNING:
        _RUNNING.pop().stop()


class RemoteObject(NamedTuple):
    url: str  # as shown: scheme://bucket/key
    key: str  # as the filesystem names it: bucket/key
    size: int
    etag: str
    local: str  # where it is staged
    index: int = -1  # the input file it becomes (the order the tasks read them in)


def discover(paths: list[str], *, suffixes: tuple[str, ...], out: Path, quiet: bool = False,
             stage: str | None = None, retries: int = 5, retry_wait: float = 0.5,
             on_error: str = "fail", memory: int = 1 << 30, limit: int | None = None, rank: int = 0
             ) -> Sequence[InputFile]:
    """``inputs.discover`` for every command: local paths as they are; URLs listed and given the
    identities of a local copy, staged into the scratch folder of the run into ``out`` by a stager
    that runs alongside the work (``memory`` bounds how far ahead). Transient errors are retried
    ``retries`` times; with ``on_error="skip"`` every object is staged first and one that stays
    unreadable is left out (listed in the result's ``skipped``)."""
    urls = [p for p in paths if is_url(p)]
    if not urls:  # one folder of a local run is listed on disk (a cluster stage's ranks share the scratch folder)
        return inputs.discover(paths, suffixes=suffixes, progress=Progress(quiet=quiet),
                               listing=listing_path(out) if stage is None else None)
    if len(urls) != len(paths):
        raise UsageError("the inputs mix URLs and local paths; give one kind (stage the local files to the store, "
                         "or download the objects)")
    fs = schemes.filesystem(urls)
    policy = retry.Policy(retries=retries, wait=retry_wait)
    # a cluster stage's rank stages what it reads into a folder of its own (ranks share the scratch folder)
    root = staging_path(out) if stage is None else work_path(out) / f"rank-{rank}" / STAGED[0]
    objects: list[RemoteObject] = []
    entries: list[_Entry] = []
    twice = inputs.NamedTwice()
    for at, url in enumerate(urls):
        found, entry = _list(fs, url, suffixes, root, policy)
        kept = {o.url for o in found if twice.first(o.url, at)}  # an object named twice is read once
        objects.extend(o for o in found if o.url in kept)
        entries.extend(e for e in ((path, folder, [r for r in rows if r[4] in kept]) for path, folder, rows in entry)
                       if e[2])
    twice.warn([safe_url(u) for u in urls])
    in_place = {o.local for o in objects if _read_in_place(o.url)}
    staged = {o.local for o in objects if o.local not in in_place and _is_staged(root, o)}
    _prune(root, staged)  # what is left at an input's path is whole: a reader may take it as soon as it exists
    files = _identified(entries, objects, in_place)
    todo = list({o.local: o for o in objects if o.index >= 0 and o.local not in staged | in_place}.values())
    progress = Progress(quiet=quiet)
    need = sum(o.size for o in todo)
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if need > free and limit is None and stage is None:
        raise UsageError(f"staging {plural(len(todo), 'input object')} ({format_size(need)}) needs that much local disk in "
                         f"{root.parent}, beside the output; {format_size(free)} is free there")
    stager = Stager(todo=todo, fetch=lambda o, stop: _fetch(fs, root, o, stop, policy), budget=ahead(memory, free),
                    failure=root.parent / STAGED[1] / ".failed", skip=on_error == "skip", on_demand=stage is not None)
    if on_error != "skip":  # the run starts now; its readers wait for their files (``arrival``)
        if todo:
            progress.note(f"staging {len(todo):,} of {plural(len(files), 'input object')} ({format_size(need)}) into {root}, "
                          f"alongside the work")
        _RUNNING.append(stager.start())
        return files
    if todo:  # every object first, so that one that stays unreadable is left out before the run
        progress.note(f"staging {len(todo):,} of {plural(len(files), 'input object')} ({format_size(need)}) into {root}")
        with progress.bar(total=need, desc="stage", unit="B") as bar:
            stager.progress = bar.update
            try:
                stager.start().wait()
            finally:
                stager.stop()
    skipped = sorted(stager.skipped, key=lambda s: s["url"])
    if skipped:
        progress.note(f"skipped {plural(len(skipped), 'unreadable input object')} (--on-error skip): "
                      f"{', '.join(s['url'] for s in skipped[:3])}{' …' if len(skipped) > 3 else ''}")
        gone = {s["url"] for s in skipped}
        entries = [(path, folder, [r for r in rows if r[4] not in gone]) for path, folder, rows in entries]
        entries = [e for e in entries if e[2]]
        if not entries:
            raise DataError(file=safe_url(urls[0]), reason=f"no input object could be read ({len(skipped)} skipped)")
        files = _identified(entries, objects, in_place)
    result = StagedInputs(files)
    result.skipped = skipped
    return result


def ahead(memory: int, free_disk: int) -> int:
    """How many bytes the stager may download beyond the input the readers reached: ``--memory``
    (what was just written is still in the page cache when it is read, and a task is at most an
    eighth of it, so several tasks' inputs are ready), never more than half the free disk."""
    return max(1 << 20, min(memory, free_disk // 2))


_Entry = tuple[str, bool, list[tuple[str, str, int, str, str]]]  # inputs.listed's entry, each row + its URL


def _identified(entries: list[_Entry], objects: list[RemoteObject], in_place: set[str]) -> list[InputFile]:
    """The listed objects as input files (identities of a local copy, ``origin`` the object; the path
    is where it is staged, or its URL when its source reads it in place), and each object's
    ``index`` set to the file it becomes (-1: left out)."""
    files = inputs.listed([(path, folder, [r[:4] for r in rows]) for path, folder, rows in entries])
    by_local = {o.local: o for o in objects}
    index = {f.path: f.index for f in files}
    objects[:] = [o._replace(index=index.get(o.local, -1)) for o in objects]
    return [f._replace(path=by_local[f.path].url if f.path in in_place else f.path,
                       origin=f"{by_local[f.path].url}\0{by_local[f.path].etag}") for f in files]


def _read_in_place(url: str) -> bool:
    """Whether the object is read where it is, not staged: every source that reads files of its
    kind opens URLs of its scheme itself (``Reader.opens_urls``: ROOT files on XRootD, through
    uproot's XRootD source, fetch only the baskets they need). The one place that decides."""
    from shardsmith import registry

    scheme, name = schemes.scheme_of(url), url.lower()
    readers = [cls for cls in registry.loaded("source").values() if name.endswith(cls.suffixes)]
    return bool(readers) and all(scheme in cls.opens_urls for cls in readers)


def origin_url(f: InputFile) -> str:
    return f.origin.split("\0", 1)[0]


def input_root(files: Sequence[InputFile]) -> str | None:
    """The URL the staged inputs' identities are relative to (None for local inputs)."""
    roots = {origin_url(f)[:len(origin_url(f)) - len(f.rel)] for f in staged_only(files) if f.origin}
    return roots.pop() if len(roots) == 1 else None


# -- listing: what storage/listing.py found, as staged copies and input files ---------------------

def _list(fs: Any, url: str, suffixes: tuple[str, ...], root: Path, policy: retry.Policy
          ) -> tuple[list[RemoteObject], list[_Entry]]:
    """The objects ``url`` names (``listing.list_url``), each with where it is staged
    (``root/SCHEME/[HOST/]KEY``), and what ``inputs.listed`` needs of them: the local arguments they
    stand for once staged (a prefix: its folder; else each object as a file argument)."""
    scheme = schemes.scheme_of(url)
    found = listing.list_url(fs, url, suffixes=suffixes, policy=policy)
    objects = [_staged_as(o, root / scheme, safe_url(url)) for o in found.objects]
    if found.folder is None:
        return objects, [_one(o, suffixes) for o in objects]
    rows = [(o.local, got.rel, o.size, got.rel.split("/", 1)[0] if "/" in got.rel else "", o.url)
            for o, got in zip(objects, found.objects)]
    return objects, [(str(root.joinpath(scheme, *found.folder)), True, rows)]


def _one(o: RemoteObject, suffixes: tuple[str, ...]) -> _Entry:
    """One object named by the command line (or matched by a glob), as a file argument."""
    if not o.local.lower().endswith(suffixes):  # (the key of a signed URL ends with its query)
        raise UsageError(f"{o.url}: not a supported input (expected {', '.join(suffixes)})")
    return (o.local, False, [(o.local, os.path.basename(o.local), o.size, "", o.url)])


def _staged_as(o: listing.Listed, below: Path, shown: str) -> RemoteObject:
    """A listed object and where it is staged (``SCHEME/[HOST/]KEY`` below the staging folder)."""
    if any(p in ("", ".", "..") for p in o.parts) or "\0" in o.key:
        raise UsageError(f"{shown}: object {o.url!r} cannot be staged as a file (empty, . or .. in its key)")
    return RemoteObject(url=o.url, key=o.key, size=o.size, etag=o.etag, local=str(below.joinpath(*o.parts)))


# -- staging ---------------------------------------------------------------------------------------

def _etag_path(root: Path, local: str) -> Path:
    return root.parent / STAGED[1] / os.path.relpath(local, root)


def _is_staged(root: Path, o: RemoteObject) -> bool:
    try:
        return os.stat(o.local).st_size == o.size and _etag_path(root, o.local).read_text() == f"{o.size} {o.etag}"
    except (OSError, UnicodeDecodeError):
        return False


def _prune(root: Path, keep: set[str]) -> None:
    """Remove staged files no object listed now stands for (an earlier run's, a torn download), so
    the folder walk finds exactly this run's inputs."""
    if not root.is_dir():
        return
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if path not in keep:
                os.unlink(path)


def _fetch(fs: Any, root: Path, o: RemoteObject, stop: threading.Event, policy: retry.Policy) -> int:
    """One object to its staged path: a temporary name, renamed when whole; then its ETag. Read in
    blocks, so a stopped run (``stop``) never waits for a large object to finish; a read that breaks
    off is retried from the byte it reached."""
    local = Path(o.local)
    local.parent.mkdir(parents=True, exist_ok=True)
    etag = _etag_path(root, o.local)
    etag.unlink(missing_ok=True)  # never an old ETag beside a new copy
    tmp = local.parent / f".{local.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with listing.errors_naming(o.url, reading=True), open(tmp, "wb") as dst:
            reached = [0]

            def progressed() -> bool:
                further, reached[0] = dst.tell() > reached[0], dst.tell()
                return further

            if not retry.call(lambda: _copy(fs, o, dst, stop), policy, stop=stop, progressed=progressed):
                return 0
            dst.flush()
            os.fsync(dst.fileno())
            size = dst.tell()
        if size != o.size:
            raise DataError(file=o.url, reason=f"changed while it was downloaded ({o.size} bytes listed, {size} "
                                               f"read); run the command again once the input is stable")
        os.replace(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)
    etag.parent.mkdir(parents=True, exist_ok=True)
    tmp_etag = etag.parent / f".{etag.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    tmp_etag.write_text(f"{o.size} {o.etag}")
    os.replace(tmp_etag, etag)
    return o.size


def _copy(fs: Any, o: RemoteObject, dst: Any, stop: threading.Event) -> bool:
    """The object's bytes from ``dst``'s position on (a fresh open, a ranged read from there) to
    its end, block by block; False if the run is stopping."""
    with fs.open(o.key, "rb", block_size=BLOCK) as src:
        if dst.tell():
            src.seek(dst.tell())
        while block := src.read(BLOCK):
            if stop.is_set():
                return False
            dst.write(block)
    return True
