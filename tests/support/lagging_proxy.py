"""A loopback HTTP proxy in front of an S3 server whose listings show an object written through it only ``lag``
seconds after it was written, as a store whose listings are eventually consistent does (list-after-write): the object
itself is there at once, for a ``GET`` or ``HEAD`` by its key.

Used as ``with running(LaggingProxy(server.endpoint, lag=2.0)) as proxy:``, with ``proxy.endpoint`` as the clients'
``endpoint_url`` (``tests/storage/test_listing_lag.py``); ``hidden`` counts the entries left out of listings.
"""

from __future__ import annotations

import re
import threading
import time
from urllib.parse import unquote, urlsplit

from rewriting_proxy import Headers, RewritingProxy

__all__ = ["LaggingProxy"]


class LaggingProxy(RewritingProxy):
    """Forwards to ``upstream``; a listing leaves out the objects written through it less than ``lag`` seconds ago,
    and the folders (common prefixes) that hold no other object it knows of."""

    def __init__(self, upstream: str, *, lag: float) -> None:
        super().__init__(upstream)
        self.lag = lag
        self.hidden = 0
        self._written: dict[str, float] = {}  # "bucket/key": when its write was answered
        self._lock = threading.Lock()

    def answer(
        self, command: str, path: str, asked: dict[str, str], status: int, headers: Headers, data: bytes
    ) -> tuple[Headers, bytes]:
        parts = urlsplit(path)
        key = unquote(parts.path.lstrip("/"))
        whole_object = (command == "PUT" and "partNumber" not in parts.query) or (
            command == "POST" and "uploadId" in parts.query  # a multipart upload completed
        )
        if status == 200 and whole_object:
            with self._lock:
                self._written[key] = time.monotonic()
        listing = command == "GET" and "/" not in key and "uploads" not in parts.query
        if listing and status == 200 and ("list-type" in parts.query or "prefix" in parts.query):
            with self._lock:
                data = self._unlisted(key, data.decode()).encode()
        return headers, data

    def _young(self, key: str) -> bool:
        written = self._written.get(key)
        return written is not None and time.monotonic() - written < self.lag

    def _unlisted(self, bucket: str, listing: str) -> str:
        """``listing`` without the young objects, and the prefixes that hold only young ones."""

        def entry(match: re.Match[str]) -> str:
            key = re.search(r"<Key>(.*?)</Key>", match[0])
            if key is not None and self._young(f"{bucket}/{unquote(key[1])}"):
                self.hidden += 1
                return ""
            return match[0]

        def prefix(match: re.Match[str]) -> str:
            name = re.search(r"<Prefix>(.*?)</Prefix>", match[0])
            under = [
                key for key in self._written if name is not None and key.startswith(f"{bucket}/{unquote(name[1])}")
            ]
            if under and all(self._young(key) for key in under):
                self.hidden += 1
                return ""
            return match[0]

        listing = re.sub(r"<Contents>.*?</Contents>", entry, listing, flags=re.S)
        return re.sub(r"<CommonPrefixes>.*?</CommonPrefixes>", prefix, listing, flags=re.S)
