"""A file in a bucket opened lazily (``jaxstow.open``) whose data comes back once with a bit flipped on its way (a
faulty link or middlebox, ``flip`` of ``tests/support/faulty_proxy.py``): the read is sent again, as ``jaxstow.load``
sends it, and gives the saved values; a file whose own bytes fail their checksum fails it again, and is corrupt."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from faulty_proxy import FaultyProxy, faulty_proxy

import jaxstow
from jaxstow import Transfer
from jaxstow.errors import CorruptFileError

MiB = 1 << 20
FAST = Transfer(part_size=5 * MiB, requests=4, attempts=5, backoff=0.02)
#: A file of 6 MiB, whose data the requests after its first one bring, and one whose first request brings it whole.
LARGE = {f"w{i}": np.arange(MiB // 4, dtype=np.float32) + i for i in range(6)}
SMALL = {"w": np.arange(4000, dtype=np.float32), "b": np.ones(3000, np.float32)}
#: A file whose header fills its first request (172 kB of it for 1500 leaves).
MANY = {f"k{i:04d}": np.full(3, i, np.float32) for i in range(1500)}


@pytest.fixture(scope="module")
def bucket(s3_server) -> Iterator[tuple[FaultyProxy, dict[str, Any], str]]:
    """The files saved straight to the server, and one copy of the small one with a bit of its data flipped in the
    bucket; the proxy in front of the server, clean until a test asks for a flipped bit."""
    prefix = s3_server.url(f"flipped-lazy-{uuid.uuid4().hex[:8]}")
    direct = s3_server.storage_options
    for name, tree in (("large.jxs", LARGE), ("small.jxs", SMALL), ("damaged.jxs", SMALL), ("many.jxs", MANY)):
        jaxstow.save(f"{prefix}/{name}", tree, storage_options=direct, transfer=FAST)
    client, key = s3_server.client(), f"{prefix}/damaged.jxs".removeprefix(f"s3://{s3_server.bucket}/")
    data = bytearray(client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read())
    data[-100] ^= 1
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=bytes(data))
    with faulty_proxy(s3_server.endpoint, rate=0.0, kinds=("flip",), methods=("GET",), budget=1) as proxy:
        yield proxy, {**direct, "client_kwargs": {"endpoint_url": proxy.endpoint}}, prefix


def _flipping(proxy: FaultyProxy, paths: str) -> None:
    proxy.faults.clear()
    proxy.rate, proxy.paths = 1.0, paths


def _same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
    return got.keys() == expected.keys() and all(np.array_equal(got[key], value) for key, value in expected.items())


#: Each way of reading a lazily opened file, every leaf of it.
WAYS = {
    "item": lambda reader: {path: np.asarray(reader[path]) for path in reader.paths},
    "slice": lambda reader: {path: reader.read(path, np.s_[5:]) for path in reader.paths},
    "load": lambda reader: reader.load(as_numpy=True),
}


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize(
    ("name", "paths"),
    [("large.jxs", r"/large\.jxs bytes=(?!0-65535$)"), ("small.jxs", r"/small\.jxs bytes=0-65535$")],
    ids=["later-request", "first-request"],  # the small file's data comes with its header, and is kept
)
def test_a_lazy_read_whose_bytes_are_flipped_once_on_their_way_is_read_again(bucket, way, name, paths):
    proxy, options, prefix = bucket
    tree = LARGE if name == "large.jxs" else SMALL
    _flipping(proxy, paths)
    try:
        with jaxstow.open(f"{prefix}/{name}", storage_options=options, transfer=FAST) as reader:
            got = WAYS[way](reader)
    finally:
        proxy.rate = 0.0
    assert proxy.faults["flip"] >= 1  # one, or a few drawn at once by parallel requests of the first read
    assert _same(got, {path: value[5:] for path, value in tree.items()} if way == "slice" else tree)


@pytest.mark.parametrize("way", list(WAYS))
def test_a_lazy_read_of_a_file_damaged_in_the_bucket_is_corrupt(bucket, way):
    _, options, prefix = bucket
    url = f"{prefix}/damaged.jxs"
    with (
        jaxstow.open(url, storage_options=options, transfer=FAST) as reader,
        pytest.raises(CorruptFileError, match=r"checksum mismatch") as caught,
    ):
        WAYS[way](reader)
    assert str(caught.value).startswith(f"leaf 'w' of {url}: checksum mismatch"), caught.value


@pytest.mark.parametrize("way", ["open", "load"])
def test_a_header_whose_bytes_are_flipped_once_on_their_way_is_read_again(bucket, way):
    proxy, options, prefix = bucket
    url = f"{prefix}/many.jxs"
    _flipping(proxy, r"/many\.jxs bytes=0-65535$")
    try:
        if way == "open":
            with jaxstow.open(url, storage_options=options, transfer=FAST) as reader:
                got = WAYS["item"](reader)
        else:
            got = jaxstow.load(url, storage_options=options, transfer=FAST, as_numpy=True)
    finally:
        proxy.rate = 0.0
    assert proxy.faults["flip"] == 1
    assert _same(got, MANY)
