"""A store whose listings show a new object only seconds after it holds it (list-after-write), as some S3-compatible
stores do: the real S3 server (SeaweedFS on the loopback interface) behind a proxy whose listings leave out, for
:data:`LAG` seconds, every object written through it (``tests/support/lagging_proxy.py``). What is read back is read
straight from the server, whose listings are current.

Saves commit (a file the listing leaves out is asked for by its key); the manager that saved a step lists, restores
and keeps it by policy at once; deleted steps and failed saves leave no object behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from lagging_proxy import LaggingProxy
from rewriting_proxy import running

from jaxstow import CheckpointManager, KeepPolicy, Transfer

#: Seconds a new object stays out of the listings: longer than any test here.
LAG = 600.0
_QUICK = Transfer(attempts=2, backoff=0.0)


def _state(step: int) -> dict[str, Any]:
    return {"params": {"w": np.full(1000, step, np.float32)}, "opt": {"mu": np.full(10, -step, np.int32)}}


@pytest.fixture
def lagging(s3_server) -> Iterator[tuple[Any, LaggingProxy, str]]:
    with running(LaggingProxy(s3_server.endpoint, lag=LAG)) as proxy:
        yield s3_server, proxy, f"lag-{uuid.uuid4().hex[:8]}"


def _through(s3_server: Any, endpoint: str) -> dict[str, Any]:
    return {**s3_server.storage_options, "client_kwargs": {"endpoint_url": endpoint}}


def test_steps_saved_through_a_store_that_lists_new_objects_late_are_committed(lagging):
    server, proxy, prefix = lagging
    url = server.url(prefix, "run")
    with CheckpointManager(url, storage_options=_through(server, proxy.endpoint), transfer=_QUICK) as manager:
        for step in (1, 2):
            manager.save(step, _state(step))
    assert proxy.hidden > 0
    run = CheckpointManager(url, storage_options=server.storage_options)
    restored = run.restore(as_numpy=True)
    assert run.steps() == [1, 2] and np.array_equal(restored["params"]["w"], _state(2)["params"]["w"])


def test_the_manager_that_saved_a_step_lists_restores_and_keeps_it_before_the_store_lists_it(lagging):
    server, proxy, prefix = lagging
    options = _through(server, proxy.endpoint)
    keep = KeepPolicy(keep_last=2)
    with CheckpointManager(server.url(prefix, "run"), storage_options=options, transfer=_QUICK, keep=keep) as manager:
        for step in (1, 2, 3):
            manager.save(step, _state(step))
            manager.wait()
            assert manager.steps() == [1, 2, 3][max(0, step - 2) : step]
            assert manager.latest_step() == step
            restored = manager.restore(as_numpy=True)
            assert np.array_equal(restored["opt"]["mu"], _state(step)["opt"]["mu"]), step
    assert CheckpointManager(server.url(prefix, "run"), storage_options=server.storage_options).steps() == [2, 3]
