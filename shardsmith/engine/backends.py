"""The storage behind a URL scheme: which fsspec filesystem reads it, which package that needs, and
which extra installs it (``pip install 'shardsmith[EXTRA]'``); one line naming the extra when it is
missing (issue 15, part 6)."""

from __future__ import annotations

import os
from typing import Any

from shardsmith.core.urls import SCHEME, safe_url
from shardsmith.errors import UsageError

# scheme -> (the module its fsspec filesystem needs, the extra that installs it)
BACKENDS = {"s3": ("s3fs", "s3"), "root": ("fsspec_xrootd", "xrootd")}
HOSTED = {"root"}  # schemes whose URL names the server a filesystem is bound to: root://HOST[:PORT]//path
XROOTD_PATIENCE = {"XRD_CONNECTIONRETRY": "2", "XRD_CONNECTIONWINDOW": "5", "XRD_REQUESTTIMEOUT": "60"}
LATER = ("gs", "gcs", "http", "https", "az", "abfs", "abfss", "hf")  # named in issue 15, not built yet


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
            raise UsageError(f"{shown}: {scheme}:// inputs are not supported yet (s3:// and root:// are)")
        raise UsageError(f"{shown}: unknown URL scheme {scheme}:// (inputs can be local paths, s3:// or root:// URLs)")
    module, extra = BACKENDS[scheme]
    if scheme in HOSTED:  # read by the XRootD client when it loads: before the import
        # a server that does not answer: a few seconds, not XRootD's default of 5 tries 2 minutes apart
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
        hosts = {host(u) for u in urls}
        if len(hosts) > 1 or "" in hosts:
            raise UsageError(f"{shown}: give {scheme}:// inputs of one server, as {scheme}://HOST[:PORT]//path")
        return fsspec.filesystem(scheme, hostid=hosts.pop(), skip_instance_cache=True, use_listings_cache=False)
    # s3fs and botocore retry on their own: off (one attempt each), so ``retry`` alone decides
    fs = fsspec.filesystem(scheme, skip_instance_cache=True, use_listings_cache=False,
                           config_kwargs={"retries": {"total_max_attempts": 1, "mode": "standard"}})
    fs.retries = 1  # s3fs's own loop: one attempt
    return fs


def host(url: str) -> str:
    """The server of a hosted scheme's URL (``root://HOST:PORT//path`` -> ``HOST:PORT``); "" for others."""
    scheme, _, rest = url.partition("://")
    return rest.split("/", 1)[0] if scheme.lower() in HOSTED else ""


def key(scheme: str, listed: str) -> str:
    """A listed key as the filesystem opens it: XRootD lists ``//a/b`` for ``/a/b``."""
    return "/" + listed.lstrip("/") if scheme in HOSTED else listed
