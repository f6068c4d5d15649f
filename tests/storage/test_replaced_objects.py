"""An object replaced in the bucket while a reader has it open (a model uploaded again, a step rewritten by another
job): what is read after the replacement is refused, never taken for the bytes of the object that was opened, on a
real S3 server (SeaweedFS on the loopback interface).

Also behind a proxy written here that drops ``If-Match`` from every request (an S3-compatible server or cache that
ignores it, and answers with the new object and its new ETag), and one that makes the first answer's
``Content-Range`` name another size than the object's: a :class:`StorageError` that says what happened, never other
bytes, a checksum mismatch or a truncated file.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pytest
import safetensors.numpy
from rewriting_proxy import Headers, RewritingProxy, running

import jaxstow
from jaxstow.errors import FormatError, PathNotFoundError, StorageError

MiB = 1 << 20
_QUICK = jaxstow.Transfer(attempts=3, backoff=0.0, part_size=5 * MiB)


class LyingProxy(RewritingProxy):
    """Forwards to ``upstream``, dropping ``If-Match`` from every request; with ``total``, a GET that starts at byte 0
    is answered with a ``Content-Range`` that names ``total`` as the object's size. ``if_match``: the ``If-Match``
    headers dropped."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.total: int | None = None
        self.if_match: list[str] = []

    def request(self, command: str, path: str, headers: dict[str, str]) -> dict[str, str]:
        self.if_match += [value for name, value in headers.items() if name.lower() == "if-match"]
        return {name: value for name, value in headers.items() if name.lower() != "if-match"}

    def answer(
        self, command: str, path: str, asked: dict[str, str], status: int, headers: Headers, data: bytes
    ) -> tuple[Headers, bytes]:
        if self.total is not None and re.fullmatch(r"bytes=0-\d+", asked.get("Range", "")) and status == 206:
            headers = [
                (name, re.sub(r"/\d+$", f"/{self.total}", value) if name.lower() == "content-range" else value)
                for name, value in headers
            ]
        return headers, data


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


def test_a_file_deleted_while_open_says_so_and_what_to_do(bucket):
    server, prefix, fs = bucket
    url = server.url(prefix, "3", "params.safetensors")
    jaxstow.save(url, _weights(3), storage_options=server.storage_options)
    with jaxstow.open(url, storage_options=server.storage_options) as reader:
        fs.rm(url)  # the step pruned by the keep policy of the run saving there
        with pytest.raises(PathNotFoundError, match="was deleted after it was opened") as raised:
            reader["head"]
    assert raised.value.file == url and "have the run keep more steps" in str(raised.value)


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
    with running(LyingProxy(s3_server.endpoint)) as proxy:
        yield proxy, {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}


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
