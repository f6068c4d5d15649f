"""The lease of an object store's lock: a writer restarted on another host takes over the lock of a holder that renews
it no more, after one and a half of its lease, and never that of a holder that renews it; a holder whose lock was
taken over is told at its next save. Where the holder's host is this one, whether it runs is told at once."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

import fsspec
import jax.numpy as jnp
import pytest
from short_leases import LEASE, elsewhere, short_leases  # noqa: F401 - short_leases: the fixture

from jaxstow import CheckpointManager
from jaxstow._storage import lock
from jaxstow._storage.lock import LOCK_NAME, Holder, RemoteLock
from jaxstow._storage.remote_store import RemoteStore
from jaxstow.errors import CheckpointError

pytestmark = pytest.mark.usefixtures("short_leases")


def _store() -> RemoteStore:
    store = RemoteStore(f"memory://jaxstow-tests/lease-{uuid.uuid4().hex}", marker="checkpoint.json")
    store.ensure()
    return store


def test_the_lock_of_another_hosts_holder_that_renews_it_no_more_is_taken_over(caplog):
    store = _store()
    store.fs.pipe_file(store.path(LOCK_NAME), elsewhere().to_json())  # its job was killed: no one renews it
    with caplog.at_level(logging.WARNING, logger="jaxstow._storage.lock"):
        lock = RemoteLock(store)
    assert (
        "lock of process 4242 on host another-host since 2026-01-01T00:00:00+00:00, which renewed it in none of 0.6 s"
        in (caplog.text)
    )
    holder = Holder.parse(store.fs.cat_file(store.path(LOCK_NAME)))
    assert holder is not None and holder.pid == os.getpid() and holder.lease == LEASE
    lock.release()
    assert not store.fs.exists(store.path(LOCK_NAME))


def test_the_lock_of_another_hosts_holder_that_renews_it_is_refused():
    store = _store()
    holder = elsewhere()
    store.fs.pipe_file(store.path(LOCK_NAME), holder.to_json())
    stop = threading.Event()

    def renew() -> None:  # the holder's own renewals, as its host sends them
        number = 0
        while not stop.wait(LEASE / 4):
            number += 1
            store.fs.pipe_file(store.path(LOCK_NAME), holder.renewed(number).to_json())

    renewing = threading.Thread(target=renew)
    renewing.start()
    try:
        with pytest.raises(CheckpointError, match=r"process 4242 on host another-host .*one and a half of its lease"):
            RemoteLock(store)
    finally:
        stop.set()
        renewing.join()
    assert Holder.parse(store.fs.cat_file(store.path(LOCK_NAME))).token == holder.token


@pytest.mark.parametrize("lease", [0.0, 5e-324, LEASE / 4, -1.0, 1e9, float("nan"), float("inf"), "60", True])
def test_a_lock_object_whose_lease_is_no_lease_is_refused_without_waiting(lease):
    fields = json.loads(elsewhere().to_json())
    fields["lease"] = lease
    data = json.dumps(fields).encode()
    parsed = Holder.parse(data)
    assert parsed is not None and parsed.lease == 0.0  # nothing to wait out: a stranger cannot make a writer wait
    store = _store()
    store.fs.pipe_file(store.path(LOCK_NAME), data)
    with pytest.raises(CheckpointError, match="process 4242 on host another-host"):
        RemoteLock(store)


def test_a_holder_whose_lock_was_taken_over_is_told_at_its_next_save():
    url = f"memory://jaxstow-tests/lease-{uuid.uuid4().hex}"
    fs, root = fsspec.core.url_to_fs(url)
    manager = CheckpointManager(url)
    manager.save(0, {"w": jnp.ones(2)})
    manager.wait()
    # Another host's writer took the lock over (this process was stopped for longer than its lease).
    fs.pipe_file(f"{root}/{LOCK_NAME}", elsewhere().to_json())
    refused = None
    for step in range(1, 100):
        try:
            manager.save(step, {"w": jnp.ones(2)})
            manager.wait()
        except CheckpointError as error:
            refused = str(error)
            break
        threading.Event().wait(LEASE / 4)
    assert refused is not None and "no longer holds the writer's lock" in refused
    assert "process 4242 on host another-host since 2026-01-01T00:00:00+00:00 took it over" in refused
    assert Holder.parse(fs.cat_file(f"{root}/{LOCK_NAME}")).host == "another-host"  # left to its holder


def test_a_live_holder_of_this_host_is_refused_at_once_and_its_renewals_keep_its_lock():
    store = _store()
    first = RemoteLock(store)
    with pytest.raises(CheckpointError, match=f"process {os.getpid()} on host {socket.gethostname()}"):
        RemoteLock(store)
    threading.Event().wait(2 * LEASE)
    renewed = Holder.parse(store.fs.cat_file(store.path(LOCK_NAME)))
    assert renewed is not None and renewed.renewals >= 1
    first.check_held()
    first.release()


def test_a_run_restarted_on_another_host_goes_on_saving_to_a_bucket_its_killed_first_run_locked(s3_server):
    url = s3_server.url(f"restart-{uuid.uuid4().hex[:8]}")
    options = s3_server.storage_options
    with CheckpointManager(url, storage_options=options) as manager:
        manager.save(0, {"w": jnp.arange(3.0)})
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.pipe_file(f"{root}/{LOCK_NAME}", elsewhere().to_json())  # the first run's host was lost with its lock held
    restarted = CheckpointManager(url, storage_options=options)
    restarted.save(1, {"w": restarted.restore(0)["w"] + 1})
    restarted.wait()
    threading.Event().wait(LEASE)  # renewed on S3 by a PUT conditional on the lock object's ETag
    holder = Holder.parse(_lock_object(fs, f"{root}/{LOCK_NAME}"))
    assert holder is not None and holder.pid == os.getpid() and holder.renewals >= 1
    restarted.close()
    assert not fs.exists(f"{root}/{LOCK_NAME}")
    assert CheckpointManager(url, storage_options=options).restore(1)["w"].tolist() == [1.0, 2.0, 3.0]


def _lock_object(fs, path: str) -> bytes:
    """The lock object's bytes: on a loaded machine, SeaweedFS answered a read that met a renewal's PUT with "no
    such key" once, so a missing object is read again for up to 2 seconds."""
    deadline = time.monotonic() + 2.0
    while True:
        fs.invalidate_cache()
        try:
            return bytes(fs.cat_file(path))
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.parametrize("field", ["renewals", "inode", "pid"])
def test_a_lock_object_with_a_number_beyond_any_is_an_unreadable_holder_refused_not_a_crash(field):
    fields = json.loads(elsewhere().to_json())
    data = json.dumps(fields).replace(f'"{field}": {fields[field]}', f'"{field}": 1e999').encode()
    assert Holder.parse(data) is None
    store = _store()
    store.fs.pipe_file(store.path(LOCK_NAME), data)
    with pytest.raises(CheckpointError, match="a process whose lock file cannot be read"):
        RemoteLock(store)


def test_a_holder_whose_renewals_hang_counts_its_lock_lost_within_its_lease(monkeypatch):
    # Its renewals stuck (a store that does not answer), another host's writer takes the lock over after one and a
    # half leases: this holder must know it lost the lock before that, though no renewal ever returned.
    stuck = threading.Event()
    monkeypatch.setattr(lock, "_renew_remote", lambda *args: stuck.wait())
    store = _store()
    holder = RemoteLock(store)
    holder.check_held()
    threading.Event().wait(1.2 * LEASE)
    with pytest.raises(CheckpointError, match=r"no longer holds .*not renewed for \d+ s, longer than its lease"):
        holder.check_held()
    stuck.set()
    holder.release()


def test_a_release_during_a_renewal_that_lands_late_leaves_no_lock_behind(monkeypatch):
    renewing, landed, wrote = threading.Event(), threading.Event(), threading.Event()

    def late(store, read, holder, number):  # reads the lock as its own; its write lands after the release
        assert holder.same(Holder.parse(read()))
        renewing.set()
        landed.wait()
        store.fs.pipe_file(store.path(LOCK_NAME), holder.renewed(number).to_json())
        wrote.set()

    monkeypatch.setattr(lock, "_renew_remote", late)
    store = _store()
    holder = RemoteLock(store)
    assert renewing.wait(5)
    holder.release()  # at once: the renewal in flight is not waited for
    assert not store.fs.exists(store.path(LOCK_NAME))
    landed.set()
    assert wrote.wait(5)
    for _ in range(100):  # the late renewal wrote the lock object again, then withdrew it
        if not store.fs.exists(store.path(LOCK_NAME)):
            break
        threading.Event().wait(LEASE / 8)
    assert not store.fs.exists(store.path(LOCK_NAME))
    RemoteLock(store).release()
