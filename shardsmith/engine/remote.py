"""Inputs named by URL (``s3://bucket/prefix/``, ``root://host:port//folder/``, one object or file,
or a glob on them), for every command.

The objects are listed (size and ETag), then *staged*: downloaded into the run's scratch folder
(``outdir.staging_path``), laid out as ``SCHEME/BUCKET/KEY``, so the unchanged pipeline reads local
files whose identities (the path relative to the input root, an image's class folder) are those of
a local copy of the same tree: the output is byte-identical to a run on that copy.

Each download goes to a temporary name and is renamed when whole; the object's ETag is written
beside it (``inputs.etags``) afterwards, so a file is reused only when its size and ETag match the
object listed now, and a killed run resumes without downloading again. The run's fingerprint
stands for the objects (URL, size, ETag: ``InputFile.origin``), not for the copies. The staged
files go with the scratch folder when the run ends. URLs are shown without userinfo or query, and
errors of the storage client become one line naming the URL.

Transient errors (a reset connection, 5xx, throttling, timeouts) of the listing and of each
download are retried (``engine/retry.py``, the only layer that retries: s3fs's and botocore's own
retries are turned off); a download that breaks off resumes at the byte it reached, by a ranged
read on a fresh open. An object that stays unreadable stops the run, or with ``--on-error skip`` is
left out and listed (``StagedInputs.skipped``, the manifest's ``source.skipped_inputs``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, NamedTuple

from shardsmith.core.progress import Progress
from shardsmith.core.sizes import format_size
from shardsmith.core.urls import SCHEME, is_url, safe_url
from shardsmith.engine import inputs, retry
from shardsmith.engine.inputs import InputFile
from shardsmith.engine.outdir import STAGED, staging_path
from shardsmith.errors import DataError, ShardsmithError, UsageError

# scheme -> (the module its fsspec filesystem needs, the extra that installs it)
BACKENDS = {"s3": ("s3fs", "s3"), "root": ("fsspec_xrootd", "xrootd")}
HOSTED = {"root"}  # schemes whose URL names the server a filesystem is bound to: root://HOST[:PORT]//path
# XRootD's client: one connection attempt per call (``retry`` alone retries), a request waits at most 60 s,
# and a server whose connection failed is tried again at the next call (XrdCl's default refuses it for 30 min)
XROOTD_PATIENCE = {"XRD_CONNECTIONRETRY": "1", "XRD_CONNECTIONWINDOW": "5", "XRD_REQUESTTIMEOUT": "60",
                   "XRD_STREAMERRORWINDOW": "0"}
# fsspec's folder walk (XRootD's find and glob) leaves out a folder it cannot list unless told to raise
WALK_OPTIONS: dict[str, dict[str, str]] = {"root": {"on_error": "raise"}}
LATER = ("gs", "gcs", "http", "https", "az", "abfs", "abfss", "hf")  # named in issue 15, not built yet
THREADS = 8
BLOCK = 8 << 20  # bytes per ranged read of a download
_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


class StagedInputs(list):  # type: ignore[type-arg]
    """The input files, and the objects ``--on-error skip`` left out (``{"url", "reason"}``)."""

    skipped: list[dict[str, str]]


def skipped_inputs(files: list[InputFile]) -> list[dict[str, str]]:
    return list(getattr(files, "skipped", []))


def discover_inputs(opts: Any, *, suffixes: tuple[str, ...]) -> list[InputFile]:
    """``discover`` with a converting command's options (inputs, output, stage, retries, on-error)."""
    return discover(list(opts.inputs), suffixes=suffixes, out=opts.out, quiet=opts.quiet, stage=opts.stage,
                    retries=opts.retries, retry_wait=opts.retry_wait, on_error=opts.on_error)


class RemoteObject(NamedTuple):
    url: str  # as shown: scheme://bucket/key
    key: str  # as the filesystem names it: bucket/key
    size: int
    etag: str
    local: str  # where it is staged


def discover(paths: list[str], *, suffixes: tuple[str, ...], out: Path, quiet: bool = False,
             stage: str | None = None, retries: int = 5, retry_wait: float = 0.5,
             on_error: str = "fail") -> list[InputFile]:
    """``inputs.discover`` for every command: local paths as they are; URLs listed, staged into the
    scratch folder of the run into ``out``, and given the identities of a local copy. Transient
    errors are retried ``retries`` times; with ``on_error="skip"`` an object that stays unreadable
    is left out (listed in the result's ``skipped``)."""
    urls = [p for p in paths if is_url(p)]
    if not urls:
        return inputs.discover(paths, suffixes=suffixes)
    if len(urls) != len(paths):
        raise UsageError("the inputs mix URLs and local paths; give one kind (stage the local files to the store, "
                         "or download the objects)")
    if stage is not None:  # ranks would stage into one shared folder at once, replacing files others read
        raise UsageError(f"--stage {stage}: cluster stages do not take URL inputs yet; run without --stage, or "
                         f"download the inputs to the shared file system first")
    fs = _filesystem(urls)
    policy = retry.Policy(retries=retries, wait=retry_wait)
    root = staging_path(out)
    objects: list[RemoteObject] = []
    local_args: list[str] = []
    for url in urls:
        found, arg = _list(fs, url, suffixes, root, policy)
        objects.extend(found)
        local_args.extend(arg)
    _prune(root, {o.local for o in objects})
    skipped = _stage(fs, objects, root, Progress(quiet=quiet), policy, skip=on_error == "skip")
    left_out = {o.local for o in objects if o.url in {s["url"] for s in skipped}}
    local_args = [a for a in local_args if a not in left_out and os.path.exists(a)]
    if not local_args:
        raise DataError(file=safe_url(urls[0]), reason=f"no input object could be read ({len(skipped)} skipped)")
    by_local = {o.local: o for o in objects}
    files = StagedInputs(f._replace(origin=f"{by_local[f.path].url}\0{by_local[f.path].etag}")
                         for f in inputs.discover(local_args, suffixes=suffixes))
    files.skipped = skipped
    return files


def origin_url(f: InputFile) -> str:
    return f.origin.split("\0", 1)[0]


def input_root(files: list[InputFile]) -> str | None:
    """The URL the staged inputs' identities are relative to (None for local inputs)."""
    roots = {origin_url(f)[:len(origin_url(f)) - len(f.rel)] for f in files if f.origin}
    return roots.pop() if len(roots) == 1 else None


# -- the filesystem --------------------------------------------------------------------------------

def _filesystem(urls: list[str]) -> Any:
    """The fsspec filesystem of the URLs' one scheme (a fresh instance: no listing cached from
    another run), or one line saying what to install."""
    schemes = {SCHEME.match(u).group(1).lower() for u in urls}  # type: ignore[union-attr]
    if len(schemes) > 1:
        raise UsageError(f"the inputs mix URL schemes ({', '.join(sorted(schemes))}); give one kind")
    scheme = schemes.pop()
    shown = safe_url(urls[0])
    if scheme not in BACKENDS:
        if scheme in LATER:
            raise UsageError(f"{shown}: {scheme}:// inputs are not supported yet (s3:// and root:// are)")
        raise UsageError(f"{shown}: unknown URL scheme {scheme}:// (inputs can be local paths, s3:// or root:// URLs)")
    module, extra = BACKENDS[scheme]
    if scheme in HOSTED:  # read by the XRootD client when it loads: before the import
        for name, value in XROOTD_PATIENCE.items():
            os.environ.setdefault(name, value)
    try:
        import fsspec

        __import__(module)
    except ImportError:
        raise UsageError(f"{shown}: reading {scheme}:// needs {module}: pip install 'shardsmith[{extra}]'") from None
    for url in urls:
        if "@" in url[len(scheme) + 3:].split("/", 1)[0]:
            raise UsageError(f"{safe_url(url)}: {scheme}:// URLs carry no credentials; set AWS_ACCESS_KEY_ID and "
                             f"AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) instead")
    if scheme in HOSTED:
        hosts = {_host(u) for u in urls}
        if len(hosts) > 1 or "" in hosts:
            raise UsageError(f"{shown}: give {scheme}:// inputs of one server, as {scheme}://HOST[:PORT]//path")
        return fsspec.filesystem(scheme, hostid=hosts.pop(), skip_instance_cache=True, use_listings_cache=False)
    # s3fs and botocore retry on their own: off (one attempt each), so ``retry`` alone decides
    fs = fsspec.filesystem(scheme, skip_instance_cache=True, use_listings_cache=False,
                           config_kwargs={"retries": {"total_max_attempts": 1, "mode": "standard"}})
    fs.retries = 1  # s3fs's own loop: one attempt
    return fs


def _host(url: str) -> str:
    """The server of a hosted scheme's URL (``root://HOST:PORT//path`` -> ``HOST:PORT``); "" for others."""
    scheme, _, rest = url.partition("://")
    return rest.split("/", 1)[0] if scheme.lower() in HOSTED else ""


def _key(scheme: str, key: str) -> str:
    """A listed key as the filesystem opens it: XRootD lists ``//a/b`` for ``/a/b``."""
    return "/" + key.lstrip("/") if scheme in HOSTED else key


@contextlib.contextmanager
def _storage_errors(url: str, *, reading: bool = False) -> Iterator[None]:
    """The storage client's errors as one line naming ``url`` (listing: a usage error, exit 2;
    downloading: a data error, exit 1)."""
    try:
        yield
    except ShardsmithError:
        raise
    except retry.GaveUp as gave_up:  # transient errors that outlasted the retries: a data error, exit 1
        last = gave_up.last
        raise DataError(file=url, reason=f"cannot {'read' if reading else 'list'} it after {gave_up.attempts} "
                                         f"attempt{'s' if gave_up.attempts > 1 else ''} (the last: "
                                         f"{type(last).__name__}: {_one_line(last)})") from None
    except FileNotFoundError as exc:
        what = "no such bucket" if "bucket" in str(exc).lower() else "no such object or prefix"
        raise _error(url, what, reading) from None
    except PermissionError:
        raise _error(url, "access denied (check the credentials and the bucket's policy)", reading) from None
    except OSError as exc:
        if "[3011]" in str(exc) or "no such file" in str(exc).lower():  # XRootD's kNotFound
            raise _error(url, "no such file or folder on the server", reading) from None
        raise _error(url, f"cannot read it: {type(exc).__name__}: {_one_line(exc)}", reading) from None
    except Exception as exc:  # botocore's and aiohttp's many kinds: connection, credentials, throttling
        raise _error(url, f"cannot read it: {type(exc).__name__}: {_one_line(exc)}", reading) from None


def _error(url: str, what: str, reading: bool) -> ShardsmithError:
    return DataError(file=url, reason=what) if reading else UsageError(f"{url}: {what}")


def _one_line(exc: BaseException) -> str:
    """The first line of an error, without any secret it might quote."""
    text = (str(exc).strip().splitlines() or [""])[0][:300]
    for name in _SECRETS:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    text = re.sub(r"([A-Za-z][\w+.-]*://)[^\s?@/]*@", r"\1", text)  # userinfo of any URL
    text = re.sub(r"([A-Za-z][\w+.-]*://[^\s?]*)\?\S*", r"\1", text)  # a URL's query
    return re.sub(r"\?[\w.-]+=[^\s;]*", "", text)  # a query on a bare path (XRootD's messages: "/f?authz=...")


# -- listing ---------------------------------------------------------------------------------------

def _list(fs: Any, url: str, suffixes: tuple[str, ...], root: Path, policy: retry.Policy
          ) -> tuple[list[RemoteObject], list[str]]:
    """The objects ``url`` names (a prefix: the files below it with a suffix, hidden names left out as
    a folder walk does; a glob: every match, as a shell expands it; else the one object) and the
    local paths to give ``inputs.discover`` for it once they are staged."""
    shown = safe_url(url)
    scheme = url.split("://", 1)[0].lower()
    host = _host(url)
    path = _key(scheme, fs._strip_protocol(url)).rstrip("/")
    walk = WALK_OPTIONS.get(scheme, {})
    with _storage_errors(shown):
        if any(c in path for c in "*?["):
            matched = retry.call(lambda: fs.glob(path, detail=True, **walk), policy)
            found = [_object(scheme, host, _key(scheme, key), info, root, shown)
                     for key, info in sorted(matched.items()) if info.get("type") == "file"]
            if not found:
                raise UsageError(f"{shown}: no object matches")
            for o in found:
                if not o.key.lower().endswith(suffixes):
                    raise UsageError(f"{o.url}: not a supported input (expected {', '.join(suffixes)})")
            return found, [o.local for o in found]
        info = retry.call(lambda: fs.info(path or "/"), policy)
        if info.get("type") != "directory":
            o = _object(scheme, host, path, info, root, shown)
            return [o], [o.local]
        found_keys = retry.call(lambda: fs.find(path or "/", detail=True, **walk), policy)
        listed = {_key(scheme, k): v for k, v in found_keys.items()}
    found = []
    for key, info in sorted(listed.items()):
        rel = key[len(path) + 1:]
        if (info.get("type") != "file" or not rel or key.endswith("/") or not rel.lower().endswith(suffixes)
                or any(part.startswith(".") for part in rel.split("/"))):
            continue
        found.append(_object(scheme, host, key, info, root, shown))
    if not found:
        raise UsageError(f"{shown}: no input files ({', '.join(suffixes)}) below this prefix")
    return found, [str(root.joinpath(scheme, *[p for p in (host, path.strip("/")) if p]))]


def _object(scheme: str, host: str, key: str, info: dict[str, Any], root: Path, shown: str) -> RemoteObject:
    """A listed object: its URL, where it is staged (``SCHEME/[HOST/]KEY``), its size and version."""
    parts = key.strip("/").split("/") if host else key.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\0" in key:
        raise UsageError(f"{shown}: object {scheme}://{key!r} cannot be staged as a file (empty, . or .. in its key)")
    etag = str(info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or "")
    url = f"{scheme}://{host}/{key}" if host else f"{scheme}://{key}"
    return RemoteObject(url=url, key=key, size=int(info.get("size") or 0), etag=etag,
                        local=str(root.joinpath(scheme, *([host] if host else []), *parts)))


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


def _stage(fs: Any, objects: list[RemoteObject], root: Path, progress: Progress, policy: retry.Policy, *,
           skip: bool = False) -> list[dict[str, str]]:
    """Download the objects not staged yet, in parallel threads, within the free disk space. The
    first that cannot be read stops the others, or (``skip``) is left out: returns those, as
    ``{"url", "reason"}``."""
    todo = [o for o in objects if not _is_staged(root, o)]
    skipped: list[dict[str, str]] = []
    if not todo:
        return skipped
    need = sum(o.size for o in todo)
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if need > free:
        raise UsageError(f"staging {len(todo)} input objects ({format_size(need)}) needs that much local disk in "
                         f"{root.parent}, beside the output; {format_size(free)} is free there")
    progress.note(f"staging {len(todo)} of {len(objects)} input objects ({format_size(need)}) into {root}")
    pool = ThreadPoolExecutor(max_workers=min(THREADS, len(todo)), thread_name_prefix="shardsmith-stage")
    stop = threading.Event()
    try:
        with progress.bar(total=need, desc="stage", unit="B") as bar:
            of = {pool.submit(_fetch, fs, root, o, stop, policy): o for o in todo}
            pending = set(of)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                for future in done:
                    try:
                        bar.update(future.result())  # raises the first download's error
                    except DataError as exc:
                        if not skip:
                            raise
                        skipped.append({"url": of[future].url, "reason": exc.reason})
    except BaseException:
        stop.set()  # Ctrl-C or a failed download: the others stop at their next block, as temporary files
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    if skipped:
        progress.note(f"skipped {len(skipped)} unreadable input objects (--on-error skip): "
                      f"{', '.join(s['url'] for s in skipped[:3])}{' …' if len(skipped) > 3 else ''}")
    return sorted(skipped, key=lambda s: s["url"])


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
        with _storage_errors(o.url, reading=True), open(tmp, "wb") as dst:
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
