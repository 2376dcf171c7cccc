"""Retries of transient storage errors, with exponential backoff and full jitter (issue 15, part 4).

An object store answers a share of requests with a reset connection, a 500 or 503, a throttling
"SlowDown" or a timeout; the same request a moment later succeeds. ``call`` repeats such a request
up to ``retries`` more times, waiting a random time between 0 and ``min(CAP, wait * 2**n)`` before
the n-th retry ("full jitter": many clients that failed together do not retry together). Errors
that say something permanent (no such key or bucket, access denied) are raised at once. After the
last retry ``GaveUp`` says how many attempts were made and what the last one raised.

XRootD's client raises plain ``OSError``s whose text holds its status (``[FATAL] Connection error``,
``[ERROR] Operation expired``, or a server's answer ``[ERROR] Server responded with an error: [3011]
...``): ``XROOTD_TRANSIENT`` is the one table of the statuses a retry may cure.

Only this layer retries: the storage clients are configured not to (``remote.py``), so the number
of attempts is the one the options give and the tests measure.

Who calls it: ``storage/listing.py`` around each listing call, ``engine/inputs/url_inputs.py`` around each
download, the output stores and the streaming loader around each request. ``is_transient`` looks at
an error, its cause and its context (s3fs translates botocore's errors, keeping the original as the
cause): reset, refused or timed-out connections, a body cut short, 5xx and 429 answers and
throttling codes (``SlowDown``) are transient; no such key or bucket and access denied are not, and
are raised at once. ``XROOTD_TRANSIENT`` holds XrdCl's socket, connection, session and timeout
errors (``errSocketError``, ``errSocketTimeout``, ``errStreamDisconnect``, ``errConnectionError``,
``errOperationExpired``, ...) and the server's busy, overloaded, unreachable or timed-out answers
(``kXR_FileLocked``, ``kXR_Overloaded``, ``kXR_noserver``, ``kXR_ServerError``, ``kXR_ReqTimedOut``,
...); every other XRootD status (``kXR_NotFound``, ``kXR_NotAuthorized``, auth failures) is
permanent. For this layer to be the only one, ``schemes.XROOTD_PATIENCE`` gives XrdCl one
connection attempt per call and turns off its stream error window (by default XrdCl refuses a
server for 30 minutes after a failed connection, so no retry could reach a restarted server), and
fsspec's folder walk (XRootD's ``find`` and ``glob``) is told to raise (the ``root`` record's
``walk``) instead of leaving out a folder it cannot list; ``tests/test_xrootd_faults.py`` stops
(SIGSTOP), kills and restarts the Debian server in the middle of a download. s3fs's and botocore's
own retries are off (``fs.retries = 1``, botocore ``total_max_attempts: 1``); the tests measure this
layer through a fault proxy in front of moto (``tests/test_s3_faults.py``,
``tests/s3_fault_proxy.py``). gcsfs (``gs://``) cannot be told so: its ``retry_request`` fixes 6
attempts on 5xx, 408, 429 and connection errors, never on 404, with no option, so for ``gs://`` two
layers retry connection errors, and its own ``HttpError`` after six attempts is permanent here. The
tests run gcsfs's JSON-API filesystem (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: the emulator has
no gRPC Storage Control API), and that layer is untested.

``call`` retries up to ``--retries`` times (a random wait up to ``min(20 s, --retry-wait *
2**(n-1))``) and raises ``GaveUp`` (attempts, last error), which ``listing.errors_naming`` turns into
one line naming the URL and the attempts made ("cannot list it after 6 attempts (the last: ...)",
"cannot read it after ..."; a data error, exit 1). A download keeps what it has written: a retry
opens the object afresh and reads from the byte reached (a ranged GET), and the count of failures
starts again whenever an attempt got further, so a large object on a flaky store finishes and its
copy is byte-identical.
"""

from __future__ import annotations

import errno
import random
import re
import threading
from collections.abc import Callable
from typing import NamedTuple, TypeVar

T = TypeVar("T")

CAP = 20.0  # seconds: the longest wait before one retry
_TRANSIENT_ERRNOS = {errno.EBUSY, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT,
                     errno.EPIPE, errno.EAGAIN, getattr(errno, "EREMOTEIO", 121)}
# the error classes of botocore, aiohttp, urllib3 and fsspec that a retry may cure, by name (none is imported)
_TRANSIENT_NAMES = {"ClientPayloadError", "ServerDisconnectedError", "ClientOSError", "ClientConnectionError",
                    "ClientConnectorError", "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                    "ConnectTimeoutError", "IncompleteRead", "IncompleteReadError", "ResponseParserError",
                    "FSTimeoutError", "HTTPClientError", "ProtocolError", "RemoteDisconnected"}
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "RequestTimeout",
                    "InternalError", "ServiceUnavailable", "TooManyRequests", "500", "502", "503", "504"}

# The XRootD statuses a retry may cure; every other XRootD error is permanent (kXR_NotFound 3011,
# kXR_NotAuthorized 3010, kXR_isDirectory 3016, errAuthFailed ...). XrdCl's own errors by the text
# XrdClStatus.cc gives them (XrdClStatus.hh: a lost or refused connection, a timed-out request), the
# server's by their kXR_* code (XProtocol.hh: busy, overloaded, no server or replica reachable now,
# the server's own failure or timeout).
XROOTD_TRANSIENT: dict[str | int, str] = {
    "Socket error": "errSocketError", "Socket timeout": "errSocketTimeout",
    "Socket disconnected": "errSocketDisconnected", "Poller error": "errPollerError",
    "Stream disconnect": "errStreamDisconnect", "Connection error": "errConnectionError",
    "Invalid session": "errInvalidSession", "Hand shake failed": "errHandShakeFailed",
    "Operation expired": "errOperationExpired", "No more free SIDs": "errNoMoreFreeSIDs",
    3003: "kXR_FileLocked", 3007: "kXR_IOError", 3008: "kXR_NoMemory", 3012: "kXR_ServerError",
    3014: "kXR_noserver", 3020: "kXR_inProgress", 3024: "kXR_Overloaded", 3034: "kXR_ReqTimedOut",
    3035: "kXR_TimerExpired",
}
# "[FATAL] Connection error", "[ERROR] Socket error: Connection refused", "[ERROR] Server responded with
# an error: [3024] ..." (XRootDStatus::ToStr), anywhere in the text fsspec-xrootd wraps it in
_XROOTD_STATUS = re.compile(r"\[(?:ERROR|FATAL)\] (?:Server responded with an error: \[(\d+)\]|([A-Za-z ]+))")


class Policy(NamedTuple):
    """How often and how patiently to retry: ``retries`` more attempts after the first, the n-th
    after a random wait of up to ``min(CAP, wait * 2**n)`` seconds."""

    retries: int = 5
    wait: float = 0.5

    def delay(self, failures: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(CAP, self.wait * 2 ** max(0, failures - 1)))


class GaveUp(Exception):
    """A transient error that outlasted every retry: ``attempts`` made, ``last`` the final error."""

    def __init__(self, attempts: int, last: BaseException) -> None:
        super().__init__(f"{attempts} attempts")
        self.attempts = attempts
        self.last = last


def is_transient(exc: BaseException) -> bool:
    """Whether a retry may cure ``exc``: a reset or refused connection, a timeout, a 5xx or throttling
    answer. The error, its cause and its context are looked at (clients wrap each other's errors)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return False
        if isinstance(e, (ConnectionError, TimeoutError)) or type(e).__name__ in _TRANSIENT_NAMES:
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        if isinstance(e, OSError) and (status := xrootd_status(e)) is not None:
            return status in XROOTD_TRANSIENT
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if code in _TRANSIENT_CODES or int(status) >= 500 or int(status) == 429:
                return True
        e = e.__cause__ or e.__context__
    return False


def xrootd_status(exc: BaseException) -> str | int | None:
    """The XRootD status an error of its client carries: a server's kXR_* code (3011) or XrdCl's
    error text ("Connection error"); None for an error that is not XRootD's."""
    found = _XROOTD_STATUS.search(str(exc))
    if found is None:
        return None
    return int(found.group(1)) if found.group(1) else found.group(2).strip()


def call(fn: Callable[[], T], policy: Policy, *, stop: threading.Event | None = None,
         progressed: Callable[[], bool] | None = None, rng: random.Random | None = None) -> T:
    """``fn()``, retried on transient errors as ``policy`` says; ``GaveUp`` after the last attempt.
    ``progressed()`` true after a failure (a download that got further before it broke off) starts
    the count again: the bound is on failures in a row that made no progress. A set ``stop`` ends
    the waiting (the run is stopping) by raising the last error."""
    rng = rng or random.Random()
    failures = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            failures = 1 if progressed is not None and progressed() else failures + 1
            if failures > policy.retries:
                raise GaveUp(failures, exc) from exc
            if (stop or threading.Event()).wait(policy.delay(failures, rng)):
                raise
