"""A loopback HTTP proxy in front of an S3 server that misbehaves as real buckets do, on a seeded fraction of requests.

Each request it forwards draws, from one seeded generator, whether it fails and how:

- ``503``: ``503 SlowDown`` (throttling), the request never reaches the server;
- ``500``: ``500 InternalError``;
- ``reset``: the connection reset (an RST) before any answer;
- ``short``: the answer's status and headers, its full ``Content-Length`` promised, then only half of its body and
  the connection closed (an answer without a body is sent whole);
- ``slow``: the answer held back for ``slow_seconds`` before its first byte;
- ``stall``: half of the body sent, then nothing for ``slow_seconds``, then the rest;
- ``lost`` (not among the :data:`KINDS` drawn unless asked for): the request reaches the server, and the answer is
  lost to a reset, so that a client that sends it again repeats what was done;
- ``flip`` (nor this one): the answer whole, but with one bit of its body flipped on the way (a faulty link or
  middlebox that no checksum of the transport caught); of a request with a body (a write), one bit of that body;
- ``dropped`` (nor this one): a write (``PUT``) answered ``200`` with the ETag of its body, never reaching the server
  (a store that acknowledges what it does not keep).

``rate`` and ``kinds`` may be changed while it runs (a save through a clean proxy, then reads through a faulty one);
``faults`` counts the faults sent by kind (an answer with no body is never cut short or stalled). Only requests of the
methods in ``methods`` whose path and range (``/bucket/key?query bytes=0-65535``) match the regular expression
``paths`` are ever failed, and no more than ``budget`` of them (``None``: no limit).

Used as ``with faulty_proxy(server.endpoint, rate=0.08) as proxy:``, with ``proxy.endpoint`` as the clients'
``endpoint_url`` (``tests/storage/test_flaky_bucket.py``).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import http.client
import random
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["KINDS", "FaultyProxy", "faulty_proxy"]

KINDS = ("503", "500", "reset", "short", "slow", "stall")

_ERRORS = {
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect"}


class QuietServer(ThreadingHTTPServer):
    """A threading HTTP server that does not print the tracebacks of clients that hung up, as a reader that gives up
    on an answer and retries does."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ProxyHandler(BaseHTTPRequestHandler):
    """A proxy's handler: HTTP/1.1 (connections kept), no log lines, and each answer sent at once (without Nagle's
    algorithm an answer's body, written after its headers, no longer waits 40 ms for the client's acknowledgement)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args: object) -> None:
        pass


class FaultyProxy:
    """The proxy's settings and counts; ``endpoint`` is its URL."""

    def __init__(
        self,
        upstream: str,
        *,
        rate: float,
        seed: int = 0,
        kinds: tuple[str, ...] = KINDS,
        methods: tuple[str, ...] = ("GET", "HEAD"),
        slow_seconds: float = 1.0,
        paths: str = "",
        budget: int | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rate = rate
        self.kinds = kinds
        self.methods = methods
        self.slow_seconds = slow_seconds
        self.paths = paths
        self.budget = budget
        self.faults: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self._drawn = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._server = QuietServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def draw(self, method: str, request: str) -> str | None:
        """The fault this request gets, or ``None``."""
        with self._lock:
            self.requests += 1
            if method not in self.methods or not self.kinds or not re.search(self.paths, request):
                return None
            if self._random.random() >= self.rate:
                return None
            if self.budget is not None and sum(self.faults.values()) + self._drawn >= self.budget:
                return None  # counting the faults drawn and not sent yet: requests run at once
            self._drawn += 1
            return self._random.choice(self.kinds)

    def withdraw(self) -> None:
        """A fault drawn is not sent (no body to change): it counts against the budget no more."""
        with self._lock:
            self._drawn = max(self._drawn - 1, 0)

    def sent(self, kind: str) -> None:
        with self._lock:
            self._drawn = max(self._drawn - 1, 0)
            self.faults[kind] += 1

    def start(self) -> None:
        threading.Thread(target=self._server.serve_forever, daemon=True, name="faulty-proxy").start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(proxy: FaultyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(ProxyHandler):
        def _serve(self) -> None:
            try:
                self._forward()
            except ConnectionError:  # a client that gave up on a slow or broken answer
                self.close_connection = True

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            fault = proxy.draw(self.command, f"{self.path} {self.headers.get('Range', '')}")
            if fault == "flip" and body is not None and len(body) >= 2:  # a write's body, damaged on its way
                proxy.sent(fault)
                body, fault = _flipped(body), None
            if fault in ("reset", *_ERRORS):
                proxy.sent(fault)
                return self._reset() if fault == "reset" else self._error(*_ERRORS[fault])
            if fault == "dropped" and self.command == "PUT":
                proxy.sent(fault)
                self.send_response(200)
                self.send_header("ETag", f'"{hashlib.md5(body or b"").hexdigest()}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            status, reason, headers, data = self._upstream(body)
            if fault in ("short", "stall", "flip") and (self.command == "HEAD" or len(data) < 2):
                proxy.withdraw()
                fault = None  # no body to cut or change
            if fault is not None:
                proxy.sent(fault)
            if fault == "lost":
                return self._reset()
            if fault == "slow":
                time.sleep(proxy.slow_seconds)
            if fault == "flip":
                data = _flipped(data)
            self.send_response(status, reason)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP:
                    self.send_header(name, value)
            if self.command == "HEAD":
                self.send_header("Content-Length", dict((k.lower(), v) for k, v in headers).get("content-length", "0"))
                self.end_headers()
                return None
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if fault in ("short", "stall"):
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                if fault == "short":
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return None
                time.sleep(proxy.slow_seconds)
                data = data[len(data) // 2 :]
            self.wfile.write(data)
            return None

        def _upstream(self, body: bytes | None) -> tuple[int, str, list[tuple[str, str]], bytes]:
            connection = http.client.HTTPConnection(*proxy.upstream, timeout=120)
            try:
                headers = {name: value for name, value in self.headers.items() if name.lower() != "expect"}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                return answer.status, answer.reason, answer.getheaders(), answer.read()
            finally:
                connection.close()

        def _error(self, status: int, reason: str, code: str, message: str) -> None:
            text = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<Resource>{self.path}</Resource><RequestId>faulty-proxy</RequestId></Error>"
            ).encode()
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(text)

        def _reset(self) -> None:
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _serve

    return Handler


def _flipped(data: bytes) -> bytes:
    """``data`` with one bit of its middle byte flipped."""
    return data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x10]) + data[len(data) // 2 + 1 :]


@contextlib.contextmanager
def faulty_proxy(upstream: str, *, rate: float, **settings: object) -> Iterator[FaultyProxy]:
    """A running :class:`FaultyProxy` in front of ``upstream`` (an ``http://host:port`` endpoint); stopped after."""
    proxy = FaultyProxy(upstream, rate=rate, **settings)  # type: ignore[arg-type]
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
