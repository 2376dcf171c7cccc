"""One reading of what a storage client raised (s3fs, gcsfs, fsspec's HTTP, the XRootD bindings),
for every place that talks to storage: the inputs' listing and downloads, the uploads of outputs,
and the streaming loader. Each place says only which error class a failure becomes and how it
names the object; the kinds of failure and their words are decided here, once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from shardsmith.core.urls import error_line
from shardsmith.core.words import plural
from shardsmith.errors import ShardsmithError
from shardsmith.storage import retry

WORDS = {
    "no-bucket": "no such bucket",
    "missing": "no such object",
    "missing-file": "no such file or folder on the server",  # XRootD's kNotFound comes as an OSError
    "denied": "access denied (check the credentials and the bucket's policy)",
}


def describe(exc: BaseException, *, verb: str, words: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(kind, one line without credentials) of a storage client's exception; ``verb`` says what
    was being done ("read", "list", "write"). Kinds: gave-up (transient errors outlasted the
    retries), no-bucket, missing, missing-file, denied, other."""
    said = {**WORDS, **(words or {})}
    if isinstance(exc, retry.GaveUp):
        last = exc.last
        return "gave-up", (f"cannot {verb} it after {plural(exc.attempts, 'attempt')} (the last: "
                           f"{type(last).__name__}: {error_line(last)})")
    if isinstance(exc, FileNotFoundError):
        kind = "no-bucket" if "bucket" in str(exc).lower() else "missing"
        return kind, said[kind]
    if isinstance(exc, PermissionError):
        return "denied", said["denied"]
    if isinstance(exc, OSError) and ("[3011]" in str(exc) or "no such file" in str(exc).lower()):
        return "missing-file", said["missing-file"]
    return "other", f"cannot {verb} it: {type(exc).__name__}: {error_line(exc)}"


@contextlib.contextmanager
def one_line(error: Callable[[str, str], ShardsmithError], *, verb: str, words: Mapping[str, str] | None = None,
             passing: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn what the storage client raises inside into ``error(kind, text)`` (one line, no
    traceback); our own errors and the ``passing`` kinds go through unchanged."""
    try:
        yield
    except (ShardsmithError, *passing):
        raise
    except Exception as exc:  # botocore's and aiohttp's many kinds: connection, credentials, throttling
        kind, text = describe(exc, verb=verb, words=words)
        raise error(kind, text) from None


def s3_code(exc: BaseException) -> str:
    """The S3 error code (or HTTP status) behind a translated client error; "" if none."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            return str(response.get("Error", {}).get("Code") or response.get("ResponseMetadata", {})
                       .get("HTTPStatusCode", ""))
        e = e.__cause__ or e.__context__
    return ""
