"""The one table of URL schemes, for inputs, outputs (``-o``) and the loader (with ``verify`` and
``inspect``), in the spirit of fsspec's ``known_implementations``: one record per scheme says which
fsspec filesystem reads it and which extra installs it (worded by ``errors.install_hint``), how its
URLs name things, and what each role supports. Every place that asks about a scheme reads it here,
so a scheme is added (or a role opened to it) in one record; a missing extra or an unsupported
scheme is one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from shardsmith.core.urls import SCHEME, safe_url
from shardsmith.errors import UsageError, install_hint

Role = Literal["inputs", "outputs", "loader"]
ALL: frozenset[str] = frozenset({"inputs", "outputs", "loader"})
READ: frozenset[str] = frozenset({"inputs", "loader"})


@dataclass(frozen=True, kw_only=True)
class Scheme:
    """What shardsmith knows of one URL scheme."""

    name: str  # as URLs spell it, lower case
    protocol: str = ""  # fsspec's name of its filesystem ("": the scheme's own name)
    module: str = ""  # the package its fsspec filesystem needs ("": fsspec alone)
    extra: str = ""  # the extra that installs ``module``
    roles: frozenset[str] = frozenset()  # "inputs", "outputs" (-o), "loader" (and verify, inspect)
    hosted: bool = False  # the URL names the server the filesystem is bound to: root://HOST[:PORT]//path
    whole_url: bool = False  # the filesystem names an object by its whole URL; a folder is a page of links
    if_match: bool = False  # GETs can carry If-Match: the pinned ETag (s3fs's get_object), ``streamed.py``
    credentials: str = "give the URL without user:password@"  # what to do instead of user:secret@ in a URL
    # fsspec's options and attributes of a filesystem: the clients' own retries off (one attempt each),
    # so ``retry`` alone decides (docs/design.md: gcsfs's fixed retries stay, it has no switch)
    options: Mapping[str, Any] = field(default_factory=dict)
    attributes: Mapping[str, Any] = field(default_factory=dict)
    walk: Mapping[str, Any] = field(default_factory=dict)  # options of a folder walk (find, glob)
    environment: Mapping[str, str] = field(default_factory=dict)  # defaults set before ``module`` loads
    later: bool = False  # named in issue 15, not built yet
    instead: str = ""  # what to give instead of such a URL (file://: the path)


# XRootD's client: one connection attempt per call (``retry`` alone retries), a request waits at most 60 s,
# and a server whose connection failed is tried again at the next call (XrdCl's default refuses it for 30 min)
XROOTD_PATIENCE = {"XRD_CONNECTIONRETRY": "1", "XRD_CONNECTIONWINDOW": "5", "XRD_REQUESTTIMEOUT": "60",
                   "XRD_STREAMERRORWINDOW": "0"}
_S3 = {"config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"},
                         "request_checksum_calculation": "when_required"}}  # uploads send the body's MD5 instead
_AWS = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) instead"
_GOOGLE = "set GOOGLE_APPLICATION_CREDENTIALS instead"

SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme(name="s3", module="s3fs", extra="s3", roles=ALL, if_match=True, credentials=_AWS, options=_S3,
           attributes={"retries": 1}),
    # fsspec's folder walk on XRootD leaves out a folder it cannot list unless told to raise
    Scheme(name="root", module="fsspec_xrootd", extra="xrootd", roles=READ, hosted=True,
           walk={"on_error": "raise"}, environment=XROOTD_PATIENCE),
    Scheme(name="http", module="aiohttp", extra="http", roles=READ, whole_url=True),
    Scheme(name="https", module="aiohttp", extra="http", roles=READ, whole_url=True),
    Scheme(name="gs", module="gcsfs", extra="gcs", roles=READ, credentials=_GOOGLE),
    Scheme(name="gcs", module="gcsfs", extra="gcs", roles=READ, credentials=_GOOGLE),
    Scheme(name="file", instead="the local path"),
    *(Scheme(name=name, later=True) for name in ("az", "abfs", "abfss", "hf")),
)}

# how each role names itself and what it does, in its one-line messages
_DOES = {"inputs": "reading", "outputs": "writing to", "loader": "reading"}
_LEAD = {"inputs": "", "outputs": "-o ", "loader": ""}


def scheme_of(url: str) -> str:
    """The scheme of a URL, lower case ("" for a local path)."""
    m = SCHEME.match(url)
    return m.group(1).lower() if m else ""


def record(url_or_scheme: str) -> Scheme:
    """The record of a URL's scheme (or of a scheme's name); an unknown one has no roles."""
    name = scheme_of(url_or_scheme) or url_or_scheme.lower()
    return SCHEMES.get(name) or Scheme(name=name)


def known(role: Role) -> list[str]:
    """The schemes a role supports, in the table's order: ``["s3://", ...]``."""
    return [f"{s.name}://" for s in SCHEMES.values() if role in s.roles]


def check(url: str, *, role: Role) -> Scheme:
    """The record of ``url``'s scheme, or one line saying that ``role`` does not take it (and what
    does), or that the URL carries credentials."""
    s = record(url)
    shown, lead = safe_url(url), _LEAD[role]
    if role not in s.roles:
        them = ", ".join(known(role))
        if s.instead:
            raise UsageError(f"{lead}{shown}: give {s.instead} instead of a {s.name}:// URL")
        if role == "outputs":
            raise UsageError(f"-o {shown}: writing to {s.name}:// is not supported ({them} "
                             f"{'is' if len(known(role)) == 1 else 'are'})")
        what = "inputs" if role == "inputs" else "datasets"
        if s.later:
            raise UsageError(f"{shown}: {s.name}:// {what} are not supported yet ({them} are)")
        where = "local paths" if role == "inputs" else "local folders"
        raise UsageError(f"{shown}: unknown URL scheme {s.name}:// ({what} can be {where} or {them} URLs)")
    if "@" in url[len(s.name) + 3:].split("/", 1)[0]:
        raise UsageError(f"{lead}{shown}: {s.name}:// URLs carry no credentials; {s.credentials}")
    return s


def filesystem(urls: list[str], *, role: Role = "inputs") -> Any:
    """The fsspec filesystem of the URLs' one scheme (a fresh instance: no listing cached from
    another run), as the table says to make it; or one line saying what to install."""
    names = {scheme_of(u) for u in urls}
    if len(names) > 1:
        raise UsageError(f"the inputs mix URL schemes ({', '.join(sorted(names))}); give one kind")
    records = [check(u, role=role) for u in urls]
    s, shown = records[0], safe_url(urls[0])
    for name, value in s.environment.items():  # read by the client when it loads: before the import
        os.environ.setdefault(name, value)
    try:
        import fsspec

        if s.module:
            __import__(s.module)
    except ImportError:
        raise UsageError(f"{_LEAD[role]}{shown}: {_DOES[role]} {s.name}:// needs {s.module or 'fsspec'}: "
                         f"{install_hint(s.extra or s.name)}") from None
    if s.hosted:
        hosts = {host(u) for u in urls}
        if len(hosts) > 1 or "" in hosts:
            what = f"{s.name}:// inputs of one server" if role == "inputs" else f"the server of a {s.name}:// URL"
            raise UsageError(f"{shown}: give {what}, as {s.name}://HOST[:PORT]//path")
        return fsspec.filesystem(s.protocol or s.name, hostid=hosts.pop(), skip_instance_cache=True,
                                 use_listings_cache=False)
    fs = fsspec.filesystem(s.protocol or s.name, skip_instance_cache=True, use_listings_cache=False, **s.options)
    for name, value in s.attributes.items():
        setattr(fs, name, value)
    return fs


def host(url: str) -> str:
    """The server of a hosted scheme's URL (``root://HOST:PORT//path`` -> ``HOST:PORT``); "" for others."""
    name, _, rest = url.partition("://")
    return rest.split("/", 1)[0] if record(name).hosted else ""


def local_parts(scheme: str, host: str, key: str) -> list[str]:
    """The folders and name an object is staged as, below ``SCHEME/``: ``HOST/PATH`` for a hosted
    scheme or a whole URL (without its query), ``BUCKET/KEY`` else."""
    if record(scheme).whole_url:
        return safe_url(key).split("://", 1)[1].split("/")
    return [host, *key.strip("/").split("/")] if host else key.split("/")


def shown_url(scheme: str, host: str, key: str) -> str:
    """An object's URL as shown and recorded (never with userinfo or a query)."""
    if record(scheme).whole_url:
        return safe_url(key)
    return f"{scheme}://{host}/{key}" if host else f"{scheme}://{key}"


def is_folder(scheme: str, url: str, info: dict[str, Any]) -> bool:
    """Whether a URL names a folder: a prefix of a store, or (a whole-URL scheme) a page of links named
    with a final slash."""
    return info.get("type") == "directory" or (record(scheme).whole_url and url.endswith("/"))


def folder(scheme: str, path: str) -> str:
    """What the filesystem lists for the folder ``path`` (a page of links is asked for with its slash)."""
    return path + "/" if record(scheme).whole_url else path or "/"


def key(scheme: str, listed: str) -> str:
    """A listed key as the filesystem opens it: XRootD lists ``//a/b`` for ``/a/b``."""
    return "/" + listed.lstrip("/") if record(scheme).hosted else listed
