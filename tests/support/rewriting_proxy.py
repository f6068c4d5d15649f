"""A loopback HTTP proxy in front of an S3 server, whose subclasses rewrite what passes: :meth:`RewritingProxy.request`
a request's headers, :meth:`RewritingProxy.answer` an answer's headers and body.

Used as ``with running(SomeProxy(server.endpoint)) as proxy:``, with ``proxy.endpoint`` as the clients'
``endpoint_url`` (``tests/storage/test_s3_answers.py``, ``tests/storage/test_replaced_objects.py``).
"""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import TypeVar
from urllib.parse import urlsplit

from faulty_proxy import ProxyHandler, QuietServer

Headers = list[tuple[str, str]]
P = TypeVar("P", bound="RewritingProxy")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect"}


class RewritingProxy:
    """Forwards every request to ``upstream`` as :meth:`request` rewrites it, and its answer as :meth:`answer` does."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.server = QuietServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def request(self, command: str, path: str, headers: dict[str, str]) -> dict[str, str]:
        """The headers to forward for the request ``command path`` (given: its own, but ``Expect``)."""
        return headers

    def answer(
        self, command: str, path: str, asked: dict[str, str], status: int, headers: Headers, data: bytes
    ) -> tuple[Headers, bytes]:
        """The headers and body to send back for the answer to the request ``command path``, whose own headers were
        ``asked``."""
        return headers, data

    def answered(self, command: str, path: str, body: bytes, status: int) -> None:
        """Note that the request ``command path``, which sent ``body``, was answered with ``status``."""


@contextlib.contextmanager
def running(proxy: P) -> Iterator[P]:
    """``proxy`` serving on its thread while the block runs."""
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()


def _handler(proxy: RewritingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(ProxyHandler):
        def forward(self) -> None:
            with contextlib.suppress(ConnectionError):
                self._forward()

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            asked = dict(self.headers.items())
            headers = proxy.request(self.command, self.path, {n: v for n, v in asked.items() if n.lower() != "expect"})
            connection = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            connection.request(self.command, self.path, body=body, headers=headers)
            answer = connection.getresponse()
            data, answer_headers = answer.read(), answer.getheaders()
            connection.close()
            answer_headers, data = proxy.answer(self.command, self.path, asked, answer.status, answer_headers, data)
            proxy.answered(self.command, self.path, body or b"", answer.status)
            self.send_response(answer.status, answer.reason)
            for name, value in answer_headers:
                if name.lower() not in _HOP_BY_HOP:
                    self.send_header(name, value)
            if self.command == "HEAD":
                self.send_header("Content-Length", answer.getheader("Content-Length") or "0")
                self.end_headers()
                return
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

    return Handler
