"""An object replaced in the bucket while a reader has it open (a model uploaded again, a step rewritten by another
job): what is read after the replacement is refused, never taken for the bytes of the object that was opened, on a
real S3 server (SeaweedFS on the loopback interface).

Also behind a proxy written here that drops ``If-Match`` from every request (an S3-compatible server or cache that
ignores it, and answers with the new object and its new ETag), and one that makes the first answer's
``Content-Range`` name another size than the object's: a :class:`StorageError` that says what happened, never other
bytes, a checksum mismatch or a truncated file.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import fsspec
import numpy as np
import pytest
import safetensors.numpy
from faulty_proxy import QuietServer

import jaxstow
from jaxstow.errors import FormatError, StorageError

MiB = 1 << 20
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect"}
_QUICK = jaxstow.Transfer(attempts=3, backoff=0.0, part_size=5 * MiB)


class LyingProxy:
    """Forwards to ``upstream``, dropping ``If-Match`` from every request; with ``total``, a GET that starts at byte 0
    is answered with a ``Content-Range`` that names ``total`` as the object's size. ``if_match``: the ``If-Match``
    headers dropped."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.total: int | None = None
        self.if_match: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def forward(self) -> None:
                with contextlib.suppress(ConnectionError):
                    self._forward()

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {}
                for name, value in self.headers.items():
                    if name.lower() == "if-match":
                        proxy.if_match.append(value)
                    elif name.lower() != "expect":
                        headers[name] = value
                connection = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data, answer_headers = answer.read(), answer.getheaders()
                connection.close()
                first = re.fullmatch(r"bytes=0-\d+", self.headers.get("Range", ""))
                if proxy.total is not None and first and answer.status == 206:
                    answer_headers = [
                        (name, re.sub(r"/\d+$", f"/{proxy.total}", value) if name.lower() == "content-range" else value)
                        for name, value in answer_headers
                    ]
                self.send_response(answer.status, answer.reason)
                for name, value in answer_headers:
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data) if self.command != "HEAD" else 0))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"embed": rng.standard_normal((512, 512), dtype=np.float32), "head": rng.standard_normal(MiB // 4)}


@pytest.fixture
def bucket(s3_server):
    return s3_server, f"t-{uuid.uuid4().hex[:8]}", fsspec.filesystem("s3", **s3_server.storage_options)


def test_a_plain_safetensors_file_replaced_by_one_of_the_same_layout_is_refused(bucket):
    server, prefix, fs = bucket
    url = server.url(prefix, "model.safetensors")
    old, new = _weights(0), _weights(1)
    fs.pipe(url, safetensors.numpy.save(old))
    with jaxstow.open(url, storage_options=server.storage_options) as reader:
        fs.pipe(url, safetensors.numpy.save(new))  # the same header, other values, and no checksum to tell them apart
        with pytest.raises(StorageError, match="replaced while it was read") as raised:
            reader["head"]
    assert raised.value.file == url
    with jaxstow.open(url, storage_options=server.storage_options) as reader:  # opened again: the new file, whole
        np.testing.assert_array_equal(reader["head"], new["head"])


def test_a_jaxstow_file_replaced_while_open_is_refused_as_replaced_not_as_damaged(bucket):
    server, prefix, _ = bucket
    url = server.url(prefix, "w.jxs")
    jaxstow.save(url, _weights(0), storage_options=server.storage_options)
    with jaxstow.open(url, storage_options=server.storage_options) as reader:
        jaxstow.save(url, _weights(1), storage_options=server.storage_options)
        with pytest.raises(StorageError, match="replaced while it was read"):
            reader.load(as_numpy=True)


def test_a_file_left_alone_reads_whole_after_many_lazy_reads(bucket):
    server, prefix, fs = bucket
    url = server.url(prefix, "model.safetensors")
    weights = _weights(2)
    fs.pipe(url, safetensors.numpy.save(weights))
    with jaxstow.open(url, storage_options=server.storage_options) as reader:
        for _ in range(3):
            for name, value in weights.items():
                np.testing.assert_array_equal(reader[name], value)


@pytest.fixture
def lying(s3_server) -> Iterator[tuple[LyingProxy, dict[str, Any]]]:
    """The proxy, and storage options that go through it."""
    proxy = LyingProxy(s3_server.endpoint)
    threading.Thread(target=proxy.server.serve_forever, daemon=True).start()
    yield proxy, {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
    proxy.server.shutdown()
    proxy.server.server_close()


def test_a_replaced_plain_file_is_refused_where_the_server_ignores_if_match(bucket, lying):
    server, prefix, fs = bucket
    proxy, through = lying
    url = server.url(prefix, "model.safetensors")
    old, new = _weights(3), _weights(4)
    fs.pipe(url, safetensors.numpy.save(old))
    with jaxstow.open(url, storage_options=through, transfer=_QUICK) as reader:
        fs.pipe(url, safetensors.numpy.save(new))  # the same layout: only the ETag tells the new bytes apart
        with pytest.raises(StorageError, match="replaced while it was read") as raised:
            reader["head"]
    assert proxy.if_match, "jaxstow sent no If-Match: the proxy tested nothing"
    assert not isinstance(raised.value, FormatError)
    assert raised.value.file == url


def test_a_plain_file_loaded_while_replaced_is_refused_not_mixed(bucket, lying):
    server, prefix, fs = bucket
    _, through = lying
    url = server.url(prefix, "model.safetensors")
    old = {"w": np.arange(3_000_000, dtype=np.float32)}
    new = {"w": np.arange(3_000_000, dtype=np.float32) + 1}
    fs.pipe(url, safetensors.numpy.save(old))
    with jaxstow.open(url, storage_options=through, transfer=_QUICK) as reader:
        fs.pipe(url, safetensors.numpy.save(new))
        with pytest.raises(StorageError, match="replaced while it was read"):
            reader.load(as_numpy=True)  # parts of 5 MiB: several GETs, each after the replacement


def test_a_replaced_jaxstow_file_is_refused_as_replaced_not_as_corrupt_where_if_match_is_ignored(bucket, lying):
    server, prefix, _ = bucket
    _, through = lying
    url = server.url(prefix, "w.jxs")
    jaxstow.save(url, _weights(0), storage_options=server.storage_options)
    with jaxstow.open(url, storage_options=through, transfer=_QUICK) as reader:
        jaxstow.save(url, _weights(1), storage_options=server.storage_options)
        with pytest.raises(StorageError, match="replaced while it was read") as raised:
            reader.load(as_numpy=True)
    assert not isinstance(raised.value, FormatError)


def test_a_file_replaced_by_a_shorter_one_is_refused_as_replaced_not_as_truncated(bucket, lying):
    server, prefix, fs = bucket
    _, through = lying
    url = server.url(prefix, "model.safetensors")
    fs.pipe(url, safetensors.numpy.save(_weights(5)))
    with jaxstow.open(url, storage_options=through, transfer=_QUICK) as reader:
        fs.pipe(url, safetensors.numpy.save({"embed": np.zeros(4, np.float32)}))
        with pytest.raises(StorageError, match="replaced while it was read") as raised:
            reader["head"]
    assert not isinstance(raised.value, FormatError)


def test_a_file_left_alone_reads_whole_where_the_server_ignores_if_match(bucket, lying):
    server, prefix, _ = bucket
    _, through = lying
    url = server.url(prefix, "w.jxs")
    weights = _weights(6)
    jaxstow.save(url, weights, storage_options=server.storage_options)
    loaded = jaxstow.load(url, storage_options=through, transfer=_QUICK, as_numpy=True)
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value)


@pytest.mark.parametrize("total", [5000, (64 << 10) - 1])
def test_a_first_answer_whose_size_contradicts_its_range_is_a_storage_failure_not_a_truncated_file(
    bucket, lying, total
):
    server, prefix, _ = bucket
    proxy, through = lying
    url = server.url(prefix, "w.jxs")
    weights = _weights(7)
    jaxstow.save(url, weights, storage_options=server.storage_options)
    proxy.total = total  # bytes 0-65535/5000, or /65535: a last byte at or past the end that the answer names
    with pytest.raises(StorageError) as raised:
        jaxstow.load(url, storage_options=through, transfer=_QUICK, as_numpy=True)
    assert not isinstance(raised.value, FormatError)
    assert raised.value.file == url
    proxy.total = None  # the file is whole
    np.testing.assert_array_equal(jaxstow.load(url, storage_options=through, as_numpy=True)["head"], weights["head"])
