"""URLs as shardsmith shows and records them: never with credentials or signatures."""

from __future__ import annotations

import re

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(text: str) -> bool:
    return SCHEME.match(text) is not None


def safe_url(url: str) -> str:
    """``url`` without userinfo (``user:secret@``) and, for HTTP, without its query (signatures);
    any other text unchanged."""
    m = SCHEME.match(url)
    if m is None:
        return url
    scheme, rest = m.group(1), url[m.end():]
    host, slash, path = rest.partition("/")
    rest = host.rpartition("@")[2] + slash + path
    if scheme.lower() in ("http", "https"):
        rest = rest.split("?", 1)[0].split("#", 1)[0]
    return f"{scheme}://{rest}"


def safe_argv(argv: list[str]) -> list[str]:
    """A command line as it may be recorded (the manifest, the lock file): URLs made safe."""
    return [safe_url(a) for a in argv]
