"""URLs as shardsmith shows and records them: never with credentials or signatures.

Every place that shows or records a URL goes through ``safe_url``: errors, the manifest's
``command`` and ``source.input_root``, the lock file; a storage client's error text goes through
``storage/errors.py``, which also blanks the values of the AWS secret variables and removes userinfo
and queries, on bare paths in XRootD's messages too. ``tests/test_s3_faults.py`` runs with secret
values in the environment and in URLs through runs that skip, fail, are refused and are killed, and
greps everything they print and every file they leave.
"""

from __future__ import annotations

import os
import re

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


def is_url(text: str) -> bool:
    return SCHEME.match(text) is not None


def safe_url(url: str) -> str:
    """``url`` without userinfo (``user:secret@``) and without its query and fragment: an HTTP
    signature (``X-Amz-Signature=``), an XRootD token (``?authz=``) ride there, whatever the
    scheme; any other text unchanged."""
    m = SCHEME.match(url)
    if m is None:
        return url
    scheme, rest = m.group(1), url[m.end():]
    host, slash, path = rest.partition("/")
    rest = host.rpartition("@")[2] + slash + path
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    return f"{scheme}://{rest}"


def safe_argv(argv: list[str]) -> list[str]:
    """A command line as it may be recorded (the manifest, the lock file): URLs made safe, also as
    the value of an option (``--tokenizer=URL``)."""
    safe = []
    for a in argv:
        name, eq, value = a.partition("=")
        safe.append(f"{name}={safe_url(value)}" if eq and name.startswith("--") else safe_url(a))
    return safe


def error_line(exc: BaseException) -> str:
    """The first line of a storage client's error, without any secret it might quote: the values of
    the credential variables, the userinfo and query of any URL, a query on a bare path (XRootD's
    messages: ``/f?authz=...``)."""
    text = (str(exc).strip().splitlines() or [""])[0][:300]
    for name in _SECRETS:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    text = re.sub(r"([A-Za-z][\w+.-]*://)[^\s?@/]*@", r"\1", text)  # userinfo of any URL
    text = re.sub(r"([A-Za-z][\w+.-]*://[^\s?]*)\?\S*", r"\1", text)  # a URL's query
    return re.sub(r"\?[\w.-]+=[^\s;]*", "", text)
