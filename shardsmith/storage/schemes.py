"""The storage behind a URL scheme: which fsspec filesystem reads it, which package that needs, and
which extra installs it (``pip install 'shardsmith[EXTRA]'``); one line naming the extra when it is
missing (issue 15, part 6)."""

from __future__ import annotations

import os
from typing import Any

from shardsmith.core.urls import SCHEME, safe_url
from shardsmith.errors import UsageError

# scheme -> (the module its fsspec filesystem needs, the extra that installs it)
BACKENDS = {"s3": ("s3fs", "s3"), "root": ("fsspec_xrootd", "xrootd"), "http": ("aiohttp", "http"),
            "https": ("aiohttp", "http"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
HOSTED = {"root"}  # schemes whose URL names the server a filesystem is bound to: root://HOST[:PORT]//path
WHOLE_URL = {"http", "https"}  # schemes whose filesystem names an object by its whole URL; a folder is a page of links
# the clients' own retries off (one attempt each), so ``retry`` alone decides: s3fs's loop and botocore's.
# gcsfs has no such switch: its HTTP retries (6 attempts, backoff up to 32 s, on 5xx/408/429 and connection
# errors, never on 404) are fixed by a decorator when its class is defined, so they stay (docs/design.md)
OPTIONS: dict[str, dict[str, Any]] = {"s3": {"config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}}}}
ATTRIBUTES: dict[str, dict[str, Any]] = {"s3": {"retries": 1}}
CREDENTIALS = {"s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) instead",
               "gs": "set GOOGLE_APPLICATION_CREDENTIALS instead", "gcs": "set GOOGLE_APPLICATION_CREDENTIALS instead"}
# XRootD's client: one connection attempt per call (``retry`` alone retries), a request waits at most 60 s,
# and a server whose connection failed is tried again at the next call (XrdCl's default refuses it for 30 min)
XROOTD_PATIENCE = {"XRD_CONNECTIONRETRY": "1", "XRD_CONNECTIONWINDOW": "5", "XRD_REQUESTTIMEOUT": "60",
                   "XRD_STREAMERRORWINDOW": "0"}
# fsspec's folder walk (XRootD's find and glob) leaves out a folder it cannot list unless told to raise
WALK_OPTIONS: dict[str, dict[str, str]] = {"root": {"on_error": "raise"}}
LATER = ("az", "abfs", "abfss", "hf")  # named in issue 15, not built yet


def filesystem(urls: list[str]) -> Any:
    """The fsspec filesystem of the URLs' one scheme (a fresh instance: no listing cached from
    another run), or one line saying what to install."""
    schemes = {SCHEME.match(u).group(1).lower() for u in urls}  # type: ignore[union-attr]
    if len(schemes) > 1:
        raise UsageError(f"the inputs mix URL schemes ({', '.join(sorted(schemes))}); give one kind")
    scheme = schemes.pop()
    shown = safe_url(urls[0])
    if scheme not in BACKENDS:
        if scheme in LATER:
            raise UsageError(f"{shown}: {scheme}:// inputs are not supported yet ({_KNOWN} are)")
        raise UsageError(f"{shown}: unknown URL scheme {scheme}:// (inputs can be local paths or {_KNOWN} URLs)")
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
            raise UsageError(f"{safe_url(url)}: {scheme}:// URLs carry no credentials; "
                             f"{CREDENTIALS.get(scheme, 'give the URL without user:password@')}")
    if scheme in HOSTED:
        hosts = {host(u) for u in urls}
        if len(hosts) > 1 or "" in hosts:
            raise UsageError(f"{shown}: give {scheme}:// inputs of one server, as {scheme}://HOST[:PORT]//path")
        return fsspec.filesystem(scheme, hostid=hosts.pop(), skip_instance_cache=True, use_listings_cache=False)
    fs = fsspec.filesystem(scheme, skip_instance_cache=True, use_listings_cache=False, **OPTIONS.get(scheme, {}))
    for name, value in ATTRIBUTES.get(scheme, {}).items():
        setattr(fs, name, value)
    return fs


_KNOWN = ", ".join(f"{s}://" for s in BACKENDS)


def host(url: str) -> str:
    """The server of a hosted scheme's URL (``root://HOST:PORT//path`` -> ``HOST:PORT``); "" for others."""
    scheme, _, rest = url.partition("://")
    return rest.split("/", 1)[0] if scheme.lower() in HOSTED else ""


def local_parts(scheme: str, host: str, key: str) -> list[str]:
    """The folders and name an object is staged as, below ``SCHEME/``: ``HOST/PATH`` for a hosted
    scheme or a whole URL (without its query), ``BUCKET/KEY`` else."""
    if scheme in WHOLE_URL:
        return safe_url(key).split("://", 1)[1].split("/")
    return [host, *key.strip("/").split("/")] if host else key.split("/")


def shown_url(scheme: str, host: str, key: str) -> str:
    """An object's URL as shown and recorded (never with userinfo or a query)."""
    if scheme in WHOLE_URL:
        return safe_url(key)
    return f"{scheme}://{host}/{key}" if host else f"{scheme}://{key}"


def is_folder(scheme: str, url: str, info: dict[str, Any]) -> bool:
    """Whether a URL names a folder: a prefix of a store, or (a whole-URL scheme) a page of links named
    with a final slash."""
    return info.get("type") == "directory" or (scheme in WHOLE_URL and url.endswith("/"))


def folder(scheme: str, path: str) -> str:
    """What the filesystem lists for the folder ``path`` (a page of links is asked for with its slash)."""
    return path + "/" if scheme in WHOLE_URL else path or "/"


def key(scheme: str, listed: str) -> str:
    """A listed key as the filesystem opens it: XRootD lists ``//a/b`` for ``/a/b``."""
    return "/" + listed.lstrip("/") if scheme in HOSTED else listed
