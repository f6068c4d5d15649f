"""A loopback HTTP proxy in front of an S3 server whose listings lag behind what is written and deleted through it, as
a store whose listings are eventually consistent does: they show an object written through it only ``lag`` seconds
after it was written (list-after-write), and keep showing one deleted through it for ``stale`` seconds after it was
deleted (list-after-delete). The objects themselves are as the server holds them, for a ``GET`` or ``HEAD`` by key.

Used as ``with running(LaggingProxy(server.endpoint, lag=2.0, stale=2.0)) as proxy:``, with ``proxy.endpoint`` as the
clients' ``endpoint_url`` (``tests/storage/test_listing_lag.py``). With ``late="checkpoint.json"`` only the keys that
pattern finds are listed late, so a listing shows a folder as it was before its last write. ``hidden`` counts the
entries left out of listings, ``shown`` the entries of deleted objects put into them.
"""

from __future__ import annotations

import html
import re
import threading
import time
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

from rewriting_proxy import Headers, RewritingProxy

__all__ = ["LaggingProxy"]


class LaggingProxy(RewritingProxy):
    """Forwards to ``upstream``; a listing leaves out the objects written through it less than ``lag`` seconds ago
    whose key ``late`` finds (every one by default), and the folders (common prefixes) that hold no other object it
    knows of, and shows the objects deleted through it less than ``stale`` seconds ago (whatever the age of their
    write: a deleted object is listed as it was)."""

    def __init__(self, upstream: str, *, lag: float, stale: float = 0.0, late: str = "") -> None:
        super().__init__(upstream)
        self.lag = lag
        self.late = re.compile(late)
        self.stale = stale
        self.hidden = 0
        self.shown = 0
        self._written: dict[str, float] = {}  # "bucket/key": when its write was answered
        self._deleted: dict[str, float] = {}  # "bucket/key": when its deletion was answered
        self._lock = threading.Lock()

    def answer(
        self, command: str, path: str, asked: dict[str, str], status: int, headers: Headers, data: bytes
    ) -> tuple[Headers, bytes]:
        parts = urlsplit(path)
        key = unquote(parts.path.lstrip("/"))
        listing = command == "GET" and "/" not in key and "uploads" not in parts.query
        if listing and status == 200 and ("list-type" in parts.query or "prefix" in parts.query):
            query = {name: values[0] for name, values in parse_qs(parts.query).items()}
            with self._lock:
                data = self._with_deleted(key, query, self._unlisted(key, data.decode())).encode()
        return headers, data

    def answered(self, command: str, path: str, body: bytes, status: int) -> None:
        parts = urlsplit(path)
        key = unquote(parts.path.lstrip("/"))
        whole_object = (command == "PUT" and "partNumber" not in parts.query) or (
            command == "POST" and "uploadId" in parts.query  # a multipart upload completed
        )
        now = time.monotonic()
        with self._lock:
            if status == 200 and whole_object:
                self._written[key] = now
                self._deleted.pop(key, None)
            elif command == "DELETE" and status in (200, 204) and "uploadId" not in parts.query:
                self._deleted[key] = now
            elif command == "POST" and "delete" in parts.query and status == 200:  # several objects at once
                for name in re.findall(r"<Key>(.*?)</Key>", body.decode()):
                    self._deleted[f"{key}/{html.unescape(name)}"] = now

    def _young(self, key: str) -> bool:
        written = self._written.get(key)
        return written is not None and time.monotonic() - written < self.lag and self.late.search(key) is not None

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

    def _with_deleted(self, bucket: str, query: dict[str, str], listing: str) -> str:
        """``listing`` (of ``bucket``, as ``query`` asked) with the objects deleted less than ``stale`` seconds ago,
        or the prefixes (with a ``delimiter``) that hold them."""
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        encoded = query.get("encoding-type") == "url"
        listed = {_unescaped(name) for name in re.findall(r"<(?:Key|Prefix)>(.*?)</(?:Key|Prefix)>", listing)}
        added = []
        for deleted, when in sorted(self._deleted.items()):
            name = deleted.removeprefix(f"{bucket}/")
            under = deleted.startswith(f"{bucket}/") and name.startswith(prefix) and name != prefix
            if not under or time.monotonic() - when >= self.stale:
                continue
            rest = name.removeprefix(prefix)
            if delimiter and delimiter in rest:
                folder = prefix + rest.split(delimiter)[0] + delimiter
                if folder not in listed:
                    listed.add(folder)
                    added.append(f"<CommonPrefixes><Prefix>{_spelled(folder, encoded)}</Prefix></CommonPrefixes>")
            elif name not in listed:
                listed.add(name)
                added.append(
                    f"<Contents><Key>{_spelled(name, encoded)}</Key><LastModified>2020-01-01T00:00:00.000Z</LastModified>"
                    '<ETag>"00000000000000000000000000000000"</ETag><Size>0</Size>'
                    "<StorageClass>STANDARD</StorageClass></Contents>"
                )
        self.shown += len(added)
        if not added:
            return listing
        return listing.replace("</ListBucketResult>", "".join(added) + "</ListBucketResult>")


def _unescaped(text: str) -> str:
    """A key as an S3 answer spells it in XML (escaped, and URL-encoded where the listing asked for that), as is."""
    return unquote(html.unescape(text))


def _spelled(key: str, encoded: bool) -> str:
    """``key`` as a listing spells it: escaped for XML, and URL-encoded where ``encoded``."""
    return escape(quote(key, safe="/") if encoded else key)
