"""The retry helper of object storage (``storage/retry.py``): what counts as transient, how long it
waits, when it gives up; and that the retry options are not part of a run's identity."""

from __future__ import annotations

import errno
import random

import pytest

from shardsmith.engine.options import ConvertingOptions
from shardsmith.engine.output.resume import run_identity
from shardsmith.storage import retry


class _ClientError(Exception):
    def __init__(self, code: str, status: int) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


def _translated(code: str, status: int, kind: type[OSError] = OSError) -> OSError:
    err = kind(errno.EIO, "translated")  # as s3fs translates botocore's errors, the cause kept
    err.__cause__ = _ClientError(code, status)
    return err


@pytest.mark.parametrize("exc, transient", [
    (ConnectionResetError(), True),
    (TimeoutError(), True),
    (OSError(errno.EBUSY, "Service Unavailable"), True),
    (_translated("SlowDown", 503), True),
    (_translated("InternalError", 500), True),
    (_translated("NoSuchKey", 404, FileNotFoundError), False),
    (_translated("AccessDenied", 403, PermissionError), False),
    (ValueError("a bug"), False),
])
def test_transient_errors(exc, transient):
    assert retry.is_transient(exc) is transient


@pytest.mark.parametrize("text, transient", [  # as fsspec-xrootd raises them (seen from the Debian server)
    ("File stat request failed: [FATAL] Connection error", True),  # refused: the server is down
    ("File stat request failed: [ERROR] Operation expired", True),  # the server hangs (SIGSTOP)
    ("Server failed to provide directory info: [FATAL] Socket timeout", True),
    ("Bytes failed to read from open file: [ERROR] Socket error: Connection reset by peer", True),
    ("File did not open properly: [ERROR] Server responded with an error: [3024] overloaded\n", True),
    ("File did not open properly: [ERROR] Server responded with an error: [3014] no server\n", True),
    ("File stat request failed: [ERROR] Server responded with an error: [3011] Unable to locate /x; no such "
     "file or directory\n", False),
    ("[ERROR] Server responded with an error: [3010] Unable to give access; Permission denied\n", False),
    ("File did not open properly: [FATAL] Auth failed: no protocols", False),
    ("Failed to submit <bound method FileSystem.dirlist of <XRootD.client.filesystem.FileSystem object>> "
     "request: [FATAL] Connection error", True),
])
def test_xrootd_statuses(text, transient):
    assert retry.is_transient(OSError(text)) is transient


def test_the_xrootd_table_names_codes_of_both_kinds():
    assert retry.xrootd_status(OSError("x: [ERROR] Server responded with an error: [3034] late\n")) == 3034
    assert retry.xrootd_status(OSError("x: [FATAL] Connection error")) == "Connection error"
    assert retry.xrootd_status(OSError("Service Unavailable")) is None
    assert all(isinstance(k, str) or 3000 <= k < 3100 for k in retry.XROOTD_TRANSIENT)


def test_backoff_is_bounded_and_jittered():
    rng = random.Random(1)
    policy = retry.Policy(retries=8, wait=0.5)
    for n in range(1, 9):
        waits = [policy.delay(n, rng) for _ in range(200)]
        assert min(waits) >= 0 and max(waits) <= min(retry.CAP, 0.5 * 2 ** (n - 1))
        assert len(set(waits)) > 100  # full jitter: spread, not one value


def test_gives_up_after_the_retries_and_never_retries_permanent_errors():
    calls = []

    def flaky():
        calls.append(1)
        raise ConnectionResetError("reset")

    with pytest.raises(retry.GaveUp) as caught:
        retry.call(flaky, retry.Policy(retries=3, wait=0))
    assert caught.value.attempts == 4 and len(calls) == 4

    def missing():
        calls.append(1)
        raise FileNotFoundError("no such key")

    calls.clear()
    with pytest.raises(FileNotFoundError):
        retry.call(missing, retry.Policy(retries=3, wait=0))
    assert len(calls) == 1


def test_progress_starts_the_count_again():
    state = {"calls": 0}

    def breaks_off_then_finishes():
        state["calls"] += 1
        if state["calls"] < 6:
            raise ConnectionResetError("mid-body")
        return "whole"

    # every attempt got further: 5 failures in all, never 2 in a row without progress
    assert retry.call(breaks_off_then_finishes, retry.Policy(retries=1, wait=0), progressed=lambda: True) == "whole"


def test_retry_options_are_not_part_of_the_run_identity():
    a = run_identity("convert", ConvertingOptions(retries=0, retry_wait=0.01), [])
    b = run_identity("convert", ConvertingOptions(retries=9, retry_wait=3.0), [])
    assert a == b
