"""Cluster stages into object storage (``-o s3://bucket/prefix --stage ...``): the bucket is the
shared place, for clusters whose nodes share no file system.

Every rank works in a local staging folder of its own (``--staging DIR``, else one under the
user's cache keyed by the URL, the stage and the rank), with the unchanged local pipeline. What
the ranks share goes through a work prefix in the bucket, ``PREFIX/.shardsmith-work/`` (never a
dataset object: no format's own folder (``registry.own_files``), and finalize removes it):

- scatter ranks upload their finished part files, and the records computed once per run (the
  task plan, the tokenizer engine check, a trained tokenizer);
- the plan unit downloads the part files' footers and the scatter's facts, computes every split's
  tables and plan (reading the heads it needs as ranged reads), and uploads them (``PLANNED``);
- gather ranks download the records and the plan, write their shards locally (reading their
  groups' segments as ranged reads), upload them to the prefix, then the pieces that list them;
- finalize downloads the records, the plans, the pieces and only the footers of the part files
  (ranged reads into sparse local files), checks every shard a piece names against the object in
  the bucket (its size), makes the split-wide files, uploads them, the manifest last (the commit
  point), and removes the work prefix and the run record.

The prefix is claimed with the run record (``RUN_FILE``, put with ``If-None-Match: *``): every
rank of the same run agrees on it, a different command's record is refused in one line, as is a
finished dataset (cluster stages never remove objects). A rank rerun after a kill redoes only its
own work: what it finds in its staging folder is reused, and objects already in the bucket with
the size and checksum of its files are not uploaded again.

Details. A rank's staging folder is ``--staging DIR``, else the cache folder of the URL with
``STAGE-rank-R/`` added. The records computed once per run are the ``tasks-*``, ``engine-*`` and
``tokenizer-*`` JSON files (``plan.cached``). A gather rank makes each part file a sparse local file
of the object's size holding its footer (a ranged read of the tail), and ``gather.fetching`` brings
the rest as ranged reads before anything is read, in this process before any worker starts: the
segments' heads when it computes a split's plan (their payloads too for a writer that weighs them;
nothing when the plan is in the bucket already), then heads and payloads of the bucket groups its
own shard ranges lie in (neighbouring ranges less than 256 KiB apart are one request); its sparse
parts are never uploaded. Finalize makes a sparse stand-in of each shard object's size so that
``gather._cover`` checks every shard a piece names against the bucket, never uploads a stand-in
(recognised by its unchanged stamp; a writer that reads its shards back brings the ranges it reads
into their stand-ins, ``kit/shard_bytes.py``, and a shard it rewrites is uploaded over its object after
the record of its rewrite, ``pieces.reconcile``), deletes stale objects, puts the manifest, then aborts
unfinished uploads and deletes the work prefix and the run record. A rank that ends well removes
its staging folder (its lock file too: the folder is locked whole); a killed rank keeps it, and a
finalize killed after the manifest finds it with its run's record and only cleans up. A whole run
(no ``--stage``) into a prefix holding a work prefix is refused (finish the stages or remove the
prefix); ``--nanogpt`` (one file written at offsets by every gather rank) is refused in one line.
``tests/test_s3_stages_out.py``: every rank with a cache folder of its own, checked empty when it
ends; the objects equal a one-process local run's files; a gather rank killed after its first
upload reruns and uploads only what is missing; each gather rank reads less than the part files'
bytes (W = 3: pack-tokens ranks read 23/32/24 KB of 42 KB, convert 214/454/296 KB of 504 KB, as
groups straddle the ranks' boundaries and the first rank reads every head for the plan).
"""

from __future__ import annotations

import contextlib
import fnmatch
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from shardsmith.core.faults import crash_point
from shardsmith.core.manifest import MANIFEST, RUN_FILE
from shardsmith.core.progress import Progress
from shardsmith.core.words import plural
from shardsmith.engine.output.outdir import prepare_output, work_path
from shardsmith.engine.output.outhold import refuse_live
from shardsmith.engine.output.outremote import (
    WORK_PREFIX,
    RemoteOutputRun,
    _record,
    owned,
    refuse_prefix,
    staging_folder,
)
from shardsmith.engine.shuffle import gather, pieces
from shardsmith.engine.shuffle.partfile import HEAD_BYTES, TRAILER, footer_start
from shardsmith.engine.shuffle.segments import Segments
from shardsmith.errors import DatasetError, UsageError
from shardsmith.kit import shard_bytes
from shardsmith.storage.objstore import ObjectInfo, Store
from shardsmith.storage.upload import THREADS, Stamp, _stamp, publishable, published

WORK = WORK_PREFIX  # the work prefix, below the output prefix
PARTS = "part-*.bin"
RECORDS = "*.json"  # tasks-, engine-, tokenizer- (once per run), plan-, planned- (the plan's) and piece- (the gather's)
PLANNED = ("planned-*.bin", "origin*.npy", "duplicates.npy")  # the plan unit's, for the gather and finalize
FACTS = "facts"  # the scatter's per-document facts (engine/shuffle/doc_facts.py), one file per task and column
TAIL = 64 << 10  # the first ranged read of a part's end: its trailer and (mostly) its footer
GAP = 256 << 10  # ranges of a part closer than this are read as one request


def dataset_objects(listing: dict[str, ObjectInfo]) -> dict[str, ObjectInfo]:
    """The prefix's objects without the work prefix (which the dataset's checks never see)."""
    return {rel: info for rel, info in listing.items() if not rel.startswith(WORK + "/")}


def stage_folder(url: str, staging: Path | None, *, stage: str, rank: int) -> Path:
    """The rank's own local folder: ``--staging`` as given, else one per (URL, stage, rank) in the cache."""
    if staging is not None:
        return Path(staging).absolute()
    base = staging_folder(url, None)
    return base.parent / f"{stage}-rank-{rank}" / base.name


class StagedRemoteRun(RemoteOutputRun):
    """One rank of one cluster stage, sharing its work with the other ranks through the bucket."""

    def __init__(self, *, stage: str, rank: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.stage = stage
        self.rank = rank
        # finalize: local files that stand for the objects gather ranks uploaded (by their stamp:
        # one rewritten since, a split-wide file made again, is a real file)
        self.placeholders: dict[str, Stamp | None] = {}
        self.fetched: dict[str, list[tuple[int, int]]] = {}  # a gather: the ranges of each part read so far
        self.part_bytes = 0  # the part files' bytes in the bucket
        self.read_bytes = 0  # ... of which a gather read (ranged reads of its groups' segments)

    @property
    def lock_stage(self) -> str | None:
        return None  # the staging folder is this rank's alone: locked whole, its lock file removed at the end

    @property
    def work(self) -> Path:
        return work_path(self.out)

    def claim(self, run: dict[str, str], *, input_bytes: int = 0) -> dict[str, Any] | None:
        self.run = run
        listing = self.store.list()
        present = dataset_objects(listing)
        record = _record(self.store) if RUN_FILE in present else None
        if MANIFEST in present and record == run and self.stage == "finalize":
            return self._complete(listing)
        if MANIFEST in present:
            raise UsageError(f"-o {self.url}: already holds a finished dataset (manifest.json); cluster stages "
                             f"never remove objects: give them an empty prefix")
        refuse_live(self.store, record)  # a whole run's, writing into the prefix now
        refuse_prefix(self.store, present, overwrite=False, record=True)
        if record is None and not self.store.put_new(RUN_FILE, orjson.dumps(run)):
            record = _record(self.store)
        if record is not None and record != run:
            raise UsageError(f"-o {self.url}: holds the unfinished output of a different run "
                             f"({record.get('command', '?')} with other options or changed inputs); finish that "
                             f"run, or remove the prefix to start over")
        self.claimed = True
        prepare_output(self.out, overwrite=False, run=run, stage=self.stage)
        crash_point("claimed")
        self._download(listing)
        return None

    # -- what the stage reads -------------------------------------------------------------------

    def _download(self, listing: dict[str, ObjectInfo]) -> None:
        """The shared records, and the parts this stage reads (whole for a gather, footers for finalize)."""
        self.work.mkdir(parents=True, exist_ok=True)
        jobs: list[tuple[str, ObjectInfo, bool]] = []
        for key, info in sorted(listing.items()):
            if not key.startswith(WORK + "/"):
                continue
            name = key[len(WORK) + 1:]
            if name.startswith(FACTS + "/") and name.count("/") == 1:
                if self.stage == "plan":  # what the scatter recorded of each document (cleaning, provenance)
                    jobs.append((name, info, True))
                continue
            if "/" in name or name == "run.json":
                continue
            planned = self.stage in ("gather", "finalize") and any(fnmatch.fnmatch(name, p) for p in PLANNED)
            if fnmatch.fnmatch(name, RECORDS) or planned or (self.stage != "scatter" and fnmatch.fnmatch(name, PARTS)):
                whole = not fnmatch.fnmatch(name, PARTS)  # parts: their footers; a gather, its segments later
                jobs.append((name, info, whole))
                if not whole:
                    self.part_bytes += info.size
        with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="shardsmith-fetch") as pool:
            for _ in pool.map(lambda job: self._fetch(*job), jobs):
                pass
        if self.stage == "finalize":
            self._restore(listing)
            self._stand_ins(listing)
            pieces.reconcile(self.work, self.out)  # shards a killed finalize rewrote: as their objects are now
            shard_bytes.bringing(self._shard_range, as_written=not any(self.work.glob("rejoined-*.json")))
        if self.stage in ("plan", "gather"):
            gather.fetching(self._segments)

    def _segments(self, segments: Segments, payloads: bool) -> None:
        """The byte ranges of ``segments`` (heads, or heads and payloads) not here yet, into their
        sparse part files: ranged reads, neighbours less than ``GAP`` apart read as one."""
        wanted: dict[str, list[tuple[int, int]]] = {}
        ends = segments.offset + (segments.nbytes if payloads else HEAD_BYTES * segments.count)
        for p, a, b in zip(segments.part.tolist(), segments.offset.tolist(), ends.tolist()):
            wanted.setdefault(segments.paths[p], []).append((a, b))
        jobs = []
        for path, spans in wanted.items():
            have = self.fetched.setdefault(path, [])
            merged: list[list[int]] = []
            for a, b in sorted(spans):
                for ha, hb in sorted(have):  # the start of a span already here (heads read for the plan)
                    if ha <= a < hb:
                        a = hb
                if a >= b:
                    continue
                if merged and a - merged[-1][1] < GAP:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            have += [(a, b) for a, b in merged]
            jobs += [(path, a, b) for a, b in merged]

        def one(job: tuple[str, int, int]) -> int:
            path, a, b = job
            data = self._range(f"{WORK}/{Path(path).name}", a, b)
            if len(data) != b - a:
                raise DatasetError(f"{self.store.show(WORK + '/' + Path(path).name)}: shorter than its footer says")
            with open(path, "r+b") as fh:
                fh.seek(a)
                fh.write(data)
            return len(data)

        with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="shardsmith-fetch") as pool:
            self.read_bytes += sum(pool.map(one, jobs))

    def _fetch(self, name: str, info: ObjectInfo, whole: bool) -> None:
        """``WORK/name`` into the local scratch folder, unless a file of its size is there; a part
        read by finalize: only its footer and trailer, at their places in a sparse file."""
        path = self.work / name
        if whole and path.is_file() and path.stat().st_size == info.size:
            return  # (a part is made afresh: which of its ranges a killed rank had read is not known)
        key = f"{WORK}/{name}"
        if whole:
            self._get(key, path)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-fetch")
        tail = self._range(key, max(0, info.size - TAIL), info.size)
        start = footer_start(tail[-TRAILER.size:], info.size, name=self.store.show(key))
        if start < info.size - len(tail):
            tail = self._range(key, start, info.size)
        with open(tmp, "wb") as fh:
            fh.truncate(info.size)
            fh.seek(info.size - len(tail))
            fh.write(tail)
        tmp.replace(path)

    def _get(self, key: str, path: Path) -> None:
        """Object ``key`` whole into ``path`` (under a temporary name, renamed into place)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-fetch")
        tmp.write_bytes(self.store.call(lambda: self.store.fs.cat_file(f"{self.store.root}/{key}"), rel=key))
        tmp.replace(path)

    def _range(self, key: str, start: int, end: int) -> bytes:
        return self.store.call(lambda: self.store.fs.cat_file(f"{self.store.root}/{key}", start=start, end=end),
                               rel=key)

    def _stand_ins(self, listing: dict[str, ObjectInfo]) -> None:
        """Finalize: a sparse local file of each dataset object's size, for the checks that every
        shard a piece names is there (``pieces.is_intact``); they are never uploaded."""
        own = owned()
        for rel, info in dataset_objects(listing).items():
            if not publishable(rel, own):
                continue
            path = self.out / rel  # made afresh even if there: a killed finalize's stand-in is no shard
            path.parent.mkdir(parents=True, exist_ok=True)  # (a format's own folder: an index, a shard)
            path.unlink(missing_ok=True)
            with open(path, "wb") as fh:
                fh.truncate(info.size)
            self.placeholders[rel] = _stamp(path)

    def _shard_range(self, rel: str, start: int, end: int) -> None:
        """Finalize: bytes ``[start, end)`` of shard object ``rel`` into its stand-in, which stays one
        (its stamp taken anew: it is not uploaded; a shard rewritten from it is a new file, which is)."""
        if rel not in self.placeholders:
            return  # whole here (a rewritten shard a killed finalize left, restored by ``_restore``)
        data = self._range(rel, start, end)
        if len(data) != end - start:
            raise DatasetError(f"{self.store.show(rel)}: shorter than its record says")
        path = self.out / rel
        with open(path, "r+b") as fh:
            fh.seek(start)
            fh.write(data)
        self.placeholders[rel] = _stamp(path)

    def _restore(self, listing: dict[str, ObjectInfo]) -> None:
        """A shard a killed finalize rewrote and was replacing in the bucket (its object deleted, the
        new one not put yet): its new bytes, from their copy under the work prefix."""
        for path in sorted(self.work.glob("rejoined-*.json")):
            rel = orjson.loads(path.read_bytes())["new"]["path"]
            if rel not in listing and (copy := f"{WORK}/rejoined/{rel}") in listing:
                self._get(copy, self.out / rel)

    # -- what the stage shares ----------------------------------------------------------------------

    def done(self) -> None:
        """The stage's work is finished locally: upload what the other stages read."""
        if not self.claimed or self.stage == "finalize":
            return
        listing = self.store.list()
        if self.stage == "gather":  # shards first: a piece in the bucket means its shards are there
            Progress(quiet=self.quiet).note(f"{self.url}: gather rank {self.rank}: read {self.read_bytes:,} of the "
                                            f"part files' {self.part_bytes:,} bytes")
            self._upload(listing, [(rel, self.out / rel) for rel in published(self.out, owned())])
        # a gather's parts are sparse copies; the plan unit's tables and plans are for the gather and finalize
        mine = (RECORDS, PARTS) if self.stage == "scatter" else (RECORDS, *PLANNED) if self.stage == "plan" else (RECORDS,)
        shared = [(f"{WORK}/{p.name}", p) for p in sorted(self.work.iterdir()) if p.is_file()
                  and p.name != "run.json" and any(fnmatch.fnmatch(p.name, pat) for pat in mine)]
        if self.stage == "scatter":
            shared += [(f"{WORK}/{FACTS}/{p.name}", p) for p in sorted((self.work / FACTS).glob("*.npy"))]
        # (uploaded at once: a rank killed meanwhile may leave a part without its facts, which the
        # gather then counts as a task not finished, and the rank's rerun uploads again)
        self._upload(listing, sorted(shared, key=lambda s: s[0].endswith(".json")))
        self._drop_staging()  # all of it is in the bucket (a killed rank keeps its folder to resume from)

    def _upload(self, listing: dict[str, ObjectInfo], files: list[tuple[str, Path]]) -> int:
        """Each file to its key unless the object there has its size and checksum; returns how many went up."""
        resumable = self.store.uploads()

        def one(item: tuple[str, Path]) -> bool:
            rel, path = item
            sent = self.store.upload(rel, path, known=listing.get(rel), resumable=resumable.get(rel, [])) is not None
            crash_point("uploaded")
            return sent

        with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="shardsmith-upload") as pool:
            sent = sum(pool.map(one, files))
        Progress(quiet=self.quiet).note(f"{self.url}: {self.stage} rank {self.rank}: {sent:,} of "
                                        f"{plural(len(files), 'file')} uploaded ({len(files) - sent:,} were there already)")
        return sent

    # -- finalize ---------------------------------------------------------------------------------

    def _publish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """The split-wide files up, stale objects gone, then the manifest (the commit point), then the
        run record and the work prefix."""
        listing = self.store.list()
        own = owned()
        names = set(published(self.out, own))
        stand_ins = {n for n, stamp in self.placeholders.items() if _stamp(self.out / n) == stamp}
        # the records of shards rewritten here (``pieces.rejoin``) before the shards go over their objects:
        # a finalize killed in between and rerun names each as its object is (``pieces.reconcile``)
        if rejoined := sorted(self.work.glob("rejoined-*.json")):  # the records, then a copy of each new shard
            self._upload(listing, [(f"{WORK}/{p.name}", p) for p in rejoined])
            rels = [orjson.loads(p.read_bytes())["new"]["path"] for p in rejoined]
            self._upload(listing, [(f"{WORK}/rejoined/{r}", self.out / r) for r in rels if r not in stand_ins])
        self._upload(listing, [(n, self.out / n) for n in sorted(names - stand_ins)])
        present = dataset_objects(listing)
        stale = [rel for rel in present if own.owns(rel) and rel not in names and rel not in (RUN_FILE, MANIFEST)]
        self.store.delete(sorted(stale))
        crash_point("uploaded-all")
        self.store.put(MANIFEST, orjson.dumps(manifest) if not (self.out / MANIFEST).is_file()
                       else (self.out / MANIFEST).read_bytes())
        crash_point("published")
        self._clean(self.store.list())
        self._drop_staging()
        return manifest

    def _clean(self, listing: dict[str, ObjectInfo]) -> None:
        for rel, ids in self.store.uploads().items():  # an upload a killed rank left unfinished
            self.store.abort(rel, ids)
        self.store.delete(sorted(rel for rel in listing if rel.startswith(WORK + "/")))
        self.store.delete([RUN_FILE] if RUN_FILE in listing else [])

    def _complete(self, listing: dict[str, ObjectInfo]) -> dict[str, Any]:
        """Finalize rerun after the manifest was put: remove what the run left, report it complete."""
        self._clean(listing)
        self._drop_staging()
        if not self.quiet:
            print(f"{self.url}: already complete (finalize was stopped after the manifest); removed the "
                  f"work prefix", file=sys.stderr)
        return orjson.loads(self.store.read(MANIFEST) or b"{}")

    def abandon(self) -> None:
        """A rank failed: it is rerun alone; the bucket and the other ranks' work stay."""
        self.close()

    def close(self) -> None:
        gather.fetching(None)
        shard_bytes.bringing(None)
        with contextlib.suppress(Exception):
            self.store.close()


def staged_session(*, url: str, stage: str, rank: int, staging: Path | None, quiet: bool, store: Store,
                   nanogpt: bool = False) -> StagedRemoteRun:
    """The session of one rank of one stage into ``url`` (the prefix's checks made before inputs are staged)."""
    if nanogpt:  # every gather rank writes its stretch of one file, which only a shared folder holds
        raise UsageError(f"-o {store.url}: --nanogpt is not made by cluster stages into object storage (its one "
                         f"file is written by every gather rank); leave it out, or stage into a shared folder")
    present = dataset_objects(store.list())
    if MANIFEST in present and stage != "finalize":
        raise UsageError(f"-o {store.url}: already holds a finished dataset (manifest.json); cluster stages never "
                         f"remove objects: give them an empty prefix")
    refuse_prefix(store, present, overwrite=False, record=True)
    local = stage_folder(url, staging, stage=stage, rank=rank)
    return StagedRemoteRun(url=url, store=store, staging=local, overwrite=False, created=[], quiet=quiet,
                           stage=stage, rank=rank)
