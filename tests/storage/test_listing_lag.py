"""A store whose listings show a new object only seconds after it holds it (list-after-write), as some S3-compatible
stores do: the real S3 server (SeaweedFS on the loopback interface) behind a proxy whose listings leave out, for
:data:`LAG` seconds, every object written through it (``tests/support/lagging_proxy.py``). What is read back is read
straight from the server, whose listings are current.

Saves commit (a file the listing leaves out is asked for by its key); the manager that saved a step lists, restores
and keeps it by policy at once; deleted steps and failed saves leave no object behind.

Listings that also keep showing, for :data:`LAG` seconds, the objects deleted through the proxy (list-after-delete)
show a step committed a moment ago as it was before its commit: its ``.jaxstow-writing``, and not its record. A
manager taking the directory over asks the store by key before it removes anything as unfinished.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from typing import Any

import forked
import forked_cli
import numpy as np
import pytest
from faulty_proxy import faulty_proxy
from lagging_proxy import LaggingProxy
from rewriting_proxy import running

from jaxstow import CheckpointManager, KeepPolicy, Transfer
from jaxstow._storage.recent import RECENT
from jaxstow.errors import CheckpointStorageError, StepNotFoundError

#: Seconds a new object stays out of the listings: longer than any test here.
LAG = 600.0
_QUICK = Transfer(attempts=2, backoff=0.0)
_STEP_FILES = ("checkpoint.json", "opt.safetensors", "params.safetensors")


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


def _keys(server: Any, prefix: str) -> list[str]:
    """The objects under ``prefix``, listed straight from the server."""
    listing = server.client().list_objects_v2(Bucket=server.bucket, Prefix=f"{prefix}/")
    return sorted(entry["Key"].removeprefix(f"{prefix}/") for entry in listing.get("Contents", []))


def test_steps_deleted_and_saves_that_failed_leave_no_object_the_listing_did_not_show(lagging):
    """A step deleted by the keep policy and a save whose upload failed remove their files by name: none stays
    behind unmarked, where no later manager would clean it and a new save of that step would be refused."""
    server, proxy, prefix = lagging
    url = server.url(prefix, "run")
    with faulty_proxy(proxy.endpoint, rate=0.0, kinds=("500",), methods=("PUT", "POST")) as faulty:
        options = _through(server, faulty.endpoint)
        with CheckpointManager(url, storage_options=options, transfer=_QUICK, keep=KeepPolicy(keep_last=1)) as manager:
            manager.save(1, _state(1))
            manager.save(2, _state(2))
            manager.wait()
            faulty.rate, faulty.paths = 1.0, r"/run/3/params"
            manager.save(3, _state(3))
            with pytest.raises(CheckpointStorageError, match="params"):
                manager.wait()
            assert _keys(server, f"{prefix}/run") == [RECENT, ".jaxstow.lock", *(f"2/{name}" for name in _STEP_FILES)]
            faulty.rate = 0.0
            manager.save(3, _state(3))
    assert faulty.faults["500"] >= 1
    assert _keys(server, f"{prefix}/run") == [RECENT, *(f"3/{name}" for name in _STEP_FILES)]


@pytest.fixture
def old_listing(s3_server) -> Iterator[tuple[Any, LaggingProxy, str]]:
    """Listings as they were before the last commits: records listed late, deleted objects listed still."""
    with running(LaggingProxy(s3_server.endpoint, lag=LAG, stale=LAG, late=r"/checkpoint\.json$")) as proxy:
        yield s3_server, proxy, f"old-{uuid.uuid4().hex[:8]}"


def test_a_manager_taking_over_steps_committed_a_moment_ago_keeps_every_file_of_them(old_listing):
    server, proxy, prefix = old_listing
    url, options = server.url(prefix, "run"), _through(server, proxy.endpoint)
    with CheckpointManager(url, storage_options=options, transfer=_QUICK) as manager:
        for step in (1, 2):
            manager.save(step, _state(step))
    with CheckpointManager(url, storage_options=options, transfer=_QUICK) as manager:
        manager.save(3, _state(3))  # takes the directory over: removes what dead writers left unfinished
    assert proxy.shown > 0 and proxy.hidden > 0
    assert _keys(server, f"{prefix}/run") == [RECENT, *(f"{step}/{name}" for step in (1, 2, 3) for name in _STEP_FILES)]
    run = CheckpointManager(url, storage_options=server.storage_options)
    assert np.array_equal(run.restore(1, as_numpy=True)["params"]["w"], _state(1)["params"]["w"])


def test_a_manager_taking_over_steps_deleted_a_moment_ago_saves_and_keeps_by_policy(old_listing):
    server, proxy, prefix = old_listing
    url, options = server.url(prefix, "run"), _through(server, proxy.endpoint)
    keep = KeepPolicy(keep_last=1)
    with CheckpointManager(url, storage_options=options, transfer=_QUICK, keep=keep) as manager:
        for step in (1, 2):
            manager.save(step, _state(step))
    proxy.lag = 0.0  # the records are listed; step 1's, deleted, still is
    with CheckpointManager(url, storage_options=options, transfer=_QUICK, keep=keep) as manager:
        manager.save(3, _state(3))
    assert proxy.shown > 0
    assert _keys(server, f"{prefix}/run") == [RECENT, *(f"3/{name}" for name in _STEP_FILES)]


def test_a_step_deleted_a_moment_ago_is_neither_restored_nor_reported_damaged(old_listing):
    server, proxy, prefix = old_listing
    url, options = server.url(prefix, "run"), _through(server, proxy.endpoint)
    proxy.lag = 0.0  # only the deleted step 1 is listed as it was
    with CheckpointManager(url, storage_options=options, transfer=_QUICK, keep=KeepPolicy(keep_last=2)) as manager:
        for step in (1, 2, 3):
            manager.save(step, _state(step))
    run = CheckpointManager(url, storage_options=options, transfer=_QUICK)
    assert proxy.shown > 0
    assert run.damaged_steps(verify="headers") == {} and run.latest_intact_step(verify="headers") == 3
    with pytest.raises(StepNotFoundError, match=r"step 1 is not in .*; its committed steps are \[2, 3\]"):
        run.restore(1)
    env = {**os.environ, "FSSPEC_S3": json.dumps(options)}
    listed = forked_cli.jaxstow_command("ls", url, env=env)
    assert listed.returncode == 0 and "DAMAGED" not in listed.stdout, listed.stdout + listed.stderr
    verified = forked_cli.jaxstow_command("verify", url, env=env)
    assert verified.returncode == 0 and f"ok       {url}/3/params.safetensors" in verified.stdout, verified.stderr


def test_a_new_manager_and_jaxstow_ls_find_the_step_committed_last_though_the_store_lists_it_late(lagging):
    server, proxy, prefix = lagging
    proxy.late = re.compile(r"/run/2/")  # step 1 is listed, step 2 not yet
    url, options = server.url(prefix, "run"), _through(server, proxy.endpoint)
    with CheckpointManager(url, storage_options=options, transfer=_QUICK) as manager:
        for step in (1, 2):
            manager.save(step, _state(step))
    run = CheckpointManager(url, storage_options=options, transfer=_QUICK)
    assert run.steps() == [1, 2] and run.latest_step() == 2 and proxy.hidden > 0
    assert np.array_equal(run.restore(as_numpy=True)["params"]["w"], _state(2)["params"]["w"])
    env = {**os.environ, "FSSPEC_S3": json.dumps(options)}
    listed = forked_cli.jaxstow_command("ls", "--json", url, env=env)
    assert [row["step"] for row in json.loads(listed.stdout)["steps"]] == [1, 2], listed.stdout + listed.stderr


def test_a_step_deleted_a_moment_ago_is_saved_again_by_its_manager_and_by_a_new_one(old_listing):
    server, proxy, prefix = old_listing
    url, options = server.url(prefix, "run"), _through(server, proxy.endpoint)
    proxy.stale = 3.0
    with CheckpointManager(url, storage_options=options, transfer=_QUICK) as manager:
        for step in (1, 2):
            manager.save(step, _state(step))
        manager.wait()
        time.sleep(proxy.stale)  # listings no longer show the .jaxstow-writing each commit removed, as minutes later
        manager.delete(2)  # its files are listed still
        assert manager.steps() == [1]
        manager.save(2, _state(20))
        manager.wait()
        manager.delete(2)
    with CheckpointManager(url, storage_options=options, transfer=_QUICK) as manager:
        assert manager.steps() == [1]
        manager.save(2, _state(21))
    assert proxy.shown > 0
    run = CheckpointManager(url, storage_options=server.storage_options)
    assert run.steps() == [1, 2] and np.array_equal(run.restore(2, as_numpy=True)["opt"]["mu"], _state(21)["opt"]["mu"])


def test_the_keep_policy_keeps_the_steps_a_step_deleted_a_moment_ago_would_have_pushed_out(old_listing):
    server, proxy, prefix = old_listing
    url, options = server.url(prefix, "run"), _through(server, proxy.endpoint)
    proxy.lag = 0.0  # the records are listed; step 3's, deleted, still is
    keep = KeepPolicy(keep_last=2)
    with CheckpointManager(url, storage_options=options, transfer=_QUICK, keep=keep) as manager:
        for step in (1, 2, 3):
            manager.save(step, _state(step))
        manager.delete(3)  # a step that went wrong
    with CheckpointManager(url, storage_options=options, transfer=_QUICK, keep=keep) as manager:
        manager.save(4, _state(4))
        assert manager.steps() == [2, 4]
    assert proxy.shown > 0
    assert _keys(server, f"{prefix}/run") == [RECENT, *(f"{step}/{name}" for step in (2, 4) for name in _STEP_FILES)]


_KILLED_SAVE = textwrap.dedent(
    """
    import json, sys, numpy as np
    from jaxstow import CheckpointManager, Transfer
    slow = Transfer(part_size=5 << 20, requests=2, max_bytes_per_second=10 << 20)
    with CheckpointManager(sys.argv[1], storage_options=json.loads(sys.argv[2]), transfer=slow) as manager:
        manager.save(1, {"a": np.ones(2)})
        manager.wait()
        manager.save(2, {"a": np.ones(2), "big": np.ones(60 << 18, np.float32)})  # 60 MiB, six seconds
    """
)


def test_a_save_killed_midway_leaves_nothing_behind_once_a_new_manager_takes_over(lagging):
    """A save SIGKILLed with one file of its step stored and the next one uploading: the next manager, whose listing
    shows none of them yet, removes the file and aborts the upload (found through .jaxstow-recent.json)."""
    server, proxy, prefix = lagging
    url, options = server.url(prefix, "run"), _through(server, proxy.endpoint)
    client, root = server.client(), f"{prefix}/run"
    writer = forked.Popen([sys.executable, "-c", _KILLED_SAVE, url, json.dumps(options)])
    try:
        deadline = time.monotonic() + 120
        while not (_uploading(client, server.bucket, f"{root}/2/big") and "2/a.safetensors" in _keys(server, root)):
            assert writer.poll() is None and time.monotonic() < deadline, "the save ended before it could be killed"
            time.sleep(0.05)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    with CheckpointManager(url, storage_options=options, transfer=_QUICK) as manager:
        manager.save(3, _state(3))  # takes the directory over
    assert proxy.hidden > 0
    assert _keys(server, root) == [RECENT, "1/a.safetensors", "1/checkpoint.json", *(f"3/{n}" for n in _STEP_FILES)]
    assert not _uploading(client, server.bucket, f"{root}/")


def _uploading(client: Any, bucket: str, prefix: str) -> bool:
    """Whether a multipart upload under ``prefix`` has a part stored."""
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    return any(
        client.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]).get("Parts")
        for upload in uploads
    )


def test_a_step_committed_or_deleted_stays_so_where_noting_it_fails(lagging, caplog):
    """A note in .jaxstow-recent.json that fails once the step is committed (or its record deleted) is logged: the
    step stays committed (or deleted), never half removed."""
    server, proxy, prefix = lagging
    url = server.url(prefix, "run")
    with faulty_proxy(proxy.endpoint, rate=0.0, kinds=("500",), methods=("PUT",), paths=r"/\.jaxstow-recent") as faulty:
        options = _through(server, faulty.endpoint)
        with CheckpointManager(url, storage_options=options, transfer=_QUICK) as manager:
            manager.save(1, _state(1))
            manager.save(2, _state(2))
            manager.wait()
            faulty.rate = 1.0
            manager.delete(1)
            assert manager.steps() == [2]
    assert faulty.faults["500"] >= 1 and "1 is deleted, but noting so failed" in caplog.text
    assert _keys(server, f"{prefix}/run") == [RECENT, *(f"2/{name}" for name in _STEP_FILES)]
