"""Writes whose request body has a bit flipped on its way to the store (``flip`` of a write, in
``tests/support/faulty_proxy.py``): the store refuses the body, which fails the checksum it was sent with
(``400 BadDigest``), and the request is sent again, as one that failed for any other passing reason is; the file
saved, and the step committed, hold the bytes saved."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from faulty_proxy import FaultyProxy, faulty_proxy

import jaxstow
from jaxstow import CheckpointManager, Transfer

MiB = 1 << 20
FAST = Transfer(part_size=5 * MiB, requests=4, attempts=5, backoff=0.02)


@pytest.fixture(scope="module")
def bucket(s3_server) -> Iterator[tuple[FaultyProxy, dict[str, Any], str]]:
    """A proxy in front of the server that flips a bit of the body of a write whose path a test names, once."""
    with faulty_proxy(s3_server.endpoint, rate=0.0, kinds=("flip",), methods=("PUT",), budget=1) as proxy:
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
        yield proxy, options, s3_server.url(f"damaged-uploads-{uuid.uuid4().hex[:8]}")


def _flipping(proxy: FaultyProxy, paths: str) -> None:
    proxy.faults.clear()
    proxy.rate, proxy.paths = 1.0, paths


def _model(scale: float) -> dict[str, np.ndarray]:
    return {f"w{i}": np.arange(MiB // 2, dtype=np.float32) * scale + i for i in range(3)}  # 6 MiB: two parts


@pytest.mark.parametrize("name", ["small.jxs", "parts.jxs"])
def test_a_file_whose_upload_is_damaged_on_its_way_is_sent_again_and_saved_whole(bucket, name):
    proxy, options, prefix = bucket
    model = {"w": np.arange(1000, dtype=np.float32)} if name == "small.jxs" else _model(1)
    _flipping(proxy, f"/{name}")
    try:
        jaxstow.save(f"{prefix}/{name}", model, storage_options=options, transfer=FAST)
    finally:
        proxy.rate = 0.0
    assert proxy.faults["flip"] >= 1  # one, or a few drawn at once by parts sent together
    loaded = jaxstow.load(f"{prefix}/{name}", storage_options=options, as_numpy=True)
    assert loaded.keys() == model.keys() and all(np.array_equal(loaded[key], model[key]) for key in model)


def test_a_step_whose_upload_is_damaged_on_its_way_is_committed_whole(bucket):
    proxy, options, prefix = bucket
    with CheckpointManager(f"{prefix}/run", storage_options=options, transfer=FAST) as manager:
        manager.save(1, {"params": _model(1)})
        manager.wait()
        _flipping(proxy, r"/run/2/params")
        try:
            manager.save(2, {"params": _model(2)})
            manager.wait()
        finally:
            proxy.rate = 0.0
    assert proxy.faults["flip"] >= 1
    run = CheckpointManager(f"{prefix}/run", storage_options=options, transfer=FAST)
    assert run.steps() == [1, 2] and run.damaged_steps() == {}
    restored = run.restore(2, as_numpy=True)["params"]
    assert all(np.array_equal(restored[key], value) for key, value in _model(2).items())
