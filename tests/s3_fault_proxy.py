"""A flaky S3 endpoint for the tests: an HTTP proxy in front of the moto server that fails a share of
the requests the way a real store does under load (issue 15, part 5).

Faults, drawn from a seeded random stream of each object (of each path: the bucket's listings share
one), so the same requests fail the same way in every run, whatever the threads' timing:

- ``slowdown``: this share of the requests is answered 503 with S3's XML error body (``SlowDown``);
- ``reset``: this share of the GETs whose answer has a body gets the status line, the headers and
  half the body, then the connection is closed;
- ``doomed``: every request whose path ends with one of these keys is answered 503 (an object that
  stays unreadable).

Every request is counted in ``requests`` (method, path, Range header, what the proxy did).
"""

from __future__ import annotations

import http.client
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId></Error>")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Faults:
    slowdown: float = 0.0
    reset: float = 0.0
    doomed: tuple[str, ...] = ()
    seed: int = 1
    requests: list[tuple[str, str, str, str]] = field(default_factory=list)
    _streams: dict[str, random.Random] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self, method: str, path: str, has_body: bool) -> str:
        """"pass", "503" or "reset" for this request."""
        key = urlsplit(path).path
        with self._lock:
            if any(key.endswith("/" + d) for d in self.doomed):
                return "503"
            draw = self._streams.setdefault(key, random.Random(f"{self.seed}:{key}")).random()
            if draw < self.slowdown:
                return "503"
            if method == "GET" and has_body and draw < self.slowdown + self.reset:
                return "reset"
            return "pass"

    def count(self, what: str) -> int:
        return sum(1 for r in self.requests if r[3] == what)


def _handler(upstream: tuple[str, int], faults: Faults) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            conn = http.client.HTTPConnection(*upstream, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                what = faults.decide(self.command, self.path, bool(data) and resp.status < 300)
                faults.requests.append((self.command, self.path, self.headers.get("Range", ""), what))
                if what == "503":
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOWDOWN)))
                    self.end_headers()
                    self.wfile.write(SLOWDOWN if self.command != "HEAD" else b"")
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", resp.getheader("Content-Length") or str(len(data)))
                self.end_headers()
                if what == "reset":  # half the body, then the connection goes away
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


@contextmanager
def fault_proxy(endpoint: str, faults: Faults) -> Iterator[str]:
    """A proxy to ``endpoint`` (``http://HOST:PORT``) on a free port, failing as ``faults`` says;
    yields its URL."""
    up = urlsplit(endpoint)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler((up.hostname or "127.0.0.1", up.port or 80), faults))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxied(s3, s3_env, monkeypatch):
    """``start(faults)``: from then on the test's runs reach the moto server (``s3``, ``s3_env``, imported by
    the test module) through a fault proxy; every proxy started is closed at the end."""
    proxies = []

    def start(faults: Faults) -> Faults:
        cm = fault_proxy(s3_env["AWS_ENDPOINT_URL"], faults)
        monkeypatch.setenv("AWS_ENDPOINT_URL", cm.__enter__())
        proxies.append(cm)
        return faults

    yield start
    for cm in proxies:
        cm.__exit__(None, None, None)
