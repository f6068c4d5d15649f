"""An object replaced in the bucket while a reader has it open (a model uploaded again, a step rewritten by another
job): what is read after the replacement is refused, never taken for the bytes of the object that was opened, on a
real S3 server (SeaweedFS on the loopback interface)."""

from __future__ import annotations

import uuid

import fsspec
import numpy as np
import pytest
import safetensors.numpy

import jaxstow
from jaxstow.errors import StorageError

MiB = 1 << 20


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
