"""The objects a URL names, listed through fsspec: a prefix (its files, as a folder walk finds them),
a glob (every match, as a shell expands it), or one object; each with its size and version (ETag),
so a copy can be trusted later only if the object is still the one listed. Transient errors are
retried (``storage/retry.py``); the storage client's errors become one line naming the URL.

Only the listing: where the objects are staged and what identities they get is the caller's
(``engine/inputs/url_inputs.py``).
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

from shardsmith.core.globs import is_glob, no_match
from shardsmith.core.urls import safe_url
from shardsmith.errors import DataError, ShardsmithError, UsageError
from shardsmith.storage import errors as storage_errors
from shardsmith.storage import retry, schemes


class Listed(NamedTuple):
    """One object: its URL as shown (``scheme://bucket/key``), its key as the filesystem opens it, its
    size and version, where a local copy of it goes below ``SCHEME/`` (``schemes.local_parts``), and
    its path below the prefix listed ("" when it was named by itself or by a glob)."""

    url: str
    key: str
    size: int
    etag: str
    parts: tuple[str, ...]
    rel: str = ""


class Listing(NamedTuple):
    """What one URL names: the objects, and for a prefix the local folder it stands for (``parts``
    below ``SCHEME/``; None when the objects were named one by one or by a glob)."""

    objects: list[Listed]
    folder: tuple[str, ...] | None


def errors_naming(url: str, *, reading: bool = False) -> contextlib.AbstractContextManager[None]:
    """The storage client's errors as one line naming ``url`` (listing: a usage error, exit 2;
    reading, or transient errors that outlasted the retries: a data error, exit 1)."""

    def error(kind: str, text: str) -> ShardsmithError:
        return DataError(file=url, reason=text) if reading or kind == "gave-up" else UsageError(f"{url}: {text}")

    return storage_errors.one_line(error, verb="read" if reading else "list",
                                   words={"missing": "no such object or prefix"})


def list_url(fs: Any, url: str, *, suffixes: tuple[str, ...], policy: retry.Policy) -> Listing:
    """The objects ``url`` names: a prefix's files with one of ``suffixes`` (hidden names left out, as
    a folder walk does), every match of a glob, or the one object."""
    shown = safe_url(url)
    scheme = schemes.record(url)
    name, host = scheme.name, schemes.host(url)
    path = schemes.key(name, fs._strip_protocol(url)).rstrip("/")
    with errors_naming(shown):
        if is_glob(path):
            matched = retry.call(lambda: fs.glob(path, detail=True, **scheme.walk), policy)
            found = [_object(name, host, schemes.key(name, key), _sized(fs, key, info, policy))
                     for key, info in sorted(matched.items()) if info.get("type") == "file"]
            if not found:
                raise no_match(shown, noun="object")
            return Listing(found, None)
        info = retry.call(lambda: fs.info(path or "/"), policy)
        if not schemes.is_folder(name, url, info):
            return Listing([_object(name, host, path, info)], None)
        below = schemes.folder(name, path)
        found_keys = retry.call(lambda: fs.find(below, detail=True, **scheme.walk), policy)
        listed = {schemes.key(name, k): v for k, v in found_keys.items()}
    found = []
    for key, info in sorted(listed.items()):
        rel = key[len(path) + 1:]
        if (info.get("type") != "file" or not rel or key.endswith("/") or not rel.lower().endswith(suffixes)
                or any(part.startswith(".") for part in rel.split("/"))):
            continue
        with errors_naming(shown):
            info = _sized(fs, key, info, policy)
        found.append(_object(name, host, key, info)._replace(rel=rel))
    if not found:
        raise UsageError(f"{shown}: no input files ({', '.join(suffixes)}) below this prefix")
    return Listing(found, tuple(p for p in schemes.local_parts(name, host, path) if p))


def _sized(fs: Any, key: str, info: dict[str, Any], policy: retry.Policy) -> dict[str, Any]:
    """A listed object's details, asked for when the listing had no size (links on a web page)."""
    return info if info.get("size") is not None else retry.call(lambda: fs.info(key), policy)


def _object(scheme: str, host: str, key: str, info: dict[str, Any]) -> Listed:
    """A listed object: its URL, its size and version, where a local copy of it goes."""
    etag = str(info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or "")
    return Listed(url=schemes.shown_url(scheme, host, key), key=key, size=int(info.get("size") or 0), etag=etag,
                  parts=tuple(schemes.local_parts(scheme, host, key)))
