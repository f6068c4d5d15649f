"""Writes whose request body has a bit flipped on its way to the store (a faulty link or middlebox): the store refuses
the body, which fails the checksum it was sent with (``400 BadDigest``), and the request is sent again, as one that
failed for any other passing reason is; the file saved, and the step committed, hold the bytes saved."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from faulty_proxy import faulty_proxy

import jaxstow
from jaxstow import CheckpointManager, Transfer

MiB = 1 << 20
FAST = Transfer(part_size=5 * MiB, requests=4, attempts=5, backoff=0.02)


class BodyFlipper:
    """Flips one bit in the middle of the body of the next ``budget`` PUTs whose path matches ``paths``."""

    def __init__(self) -> None:
        self.paths, self.budget, self.flipped = "", 0, 0
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, body: bytes | None) -> bytes | None:
        with self._lock:
            if method != "PUT" or not body or not self.budget or not re.search(self.paths, path):
                return body
            self.budget -= 1
            self.flipped += 1
        middle = len(body) // 2
        return body[:middle] + bytes([body[middle] ^ 0x10]) + body[middle + 1 :]


@pytest.fixture(scope="module")
def bucket(s3_server) -> Iterator[tuple[BodyFlipper, dict[str, Any], str]]:
    """A proxy in front of the server whose handler passes each request's body through a :class:`BodyFlipper`."""
    flipper = BodyFlipper()
    with faulty_proxy(s3_server.endpoint, rate=0.0) as proxy:
        handler = proxy._server.RequestHandlerClass  # the proxy's own handler, whose forwarding step is wrapped here

        class Flipping(handler):  # type: ignore[misc, valid-type]
            def _upstream(self, body: bytes | None) -> Any:
                return super()._upstream(flipper(self.command, self.path, body))

        proxy._server.RequestHandlerClass = Flipping
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
        yield flipper, options, s3_server.url(f"damaged-uploads-{uuid.uuid4().hex[:8]}")


def _model(scale: float) -> dict[str, np.ndarray]:
    return {f"w{i}": np.arange(MiB // 2, dtype=np.float32) * scale + i for i in range(3)}  # 6 MiB: two parts


@pytest.mark.parametrize("name", ["small.jxs", "parts.jxs"])
def test_a_file_whose_upload_is_damaged_on_its_way_is_sent_again_and_saved_whole(bucket, name):
    flipper, options, prefix = bucket
    model = {"w": np.arange(1000, dtype=np.float32)} if name == "small.jxs" else _model(1)
    flipper.paths, flipper.budget, flipper.flipped = re.escape(name), 1, 0
    jaxstow.save(f"{prefix}/{name}", model, storage_options=options, transfer=FAST)
    assert flipper.flipped == 1
    loaded = jaxstow.load(f"{prefix}/{name}", storage_options=options, as_numpy=True)
    assert loaded.keys() == model.keys() and all(np.array_equal(loaded[key], model[key]) for key in model)


def test_a_step_whose_upload_is_damaged_on_its_way_is_committed_whole(bucket):
    flipper, options, prefix = bucket
    flipper.paths, flipper.budget, flipper.flipped = r"/run/2/params", 1, 0
    with CheckpointManager(f"{prefix}/run", storage_options=options, transfer=FAST) as manager:
        for step in (1, 2):
            manager.save(step, {"params": _model(step)})
    assert flipper.flipped == 1
    run = CheckpointManager(f"{prefix}/run", storage_options=options, transfer=FAST)
    assert run.steps() == [1, 2] and run.damaged_steps() == {}
    restored = run.restore(2, as_numpy=True)["params"]
    assert all(np.array_equal(restored[key], value) for key, value in _model(2).items())
