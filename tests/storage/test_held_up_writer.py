"""A writer of an object store held up past its lock's lease (a process stopped, a machine suspended) while another
host took the lock over: its late commit of a step the other writer saved meanwhile is refused, that step kept whole;
its keep policy deletes nothing once the lock is lost; and a lock object read as "no such key" for a moment (as a
store may answer while an overwrite of it lands) is still released, or still refuses a second writer by its holder."""

from __future__ import annotations

import threading
import time
import uuid

import fsspec
import jax.numpy as jnp
import numpy as np
import pytest
from short_leases import LEASE, elsewhere, short_leases  # noqa: F401 - short_leases: the fixture

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow._coordination import Coordinator
from jaxstow._steps.record import RECORD_NAME
from jaxstow._storage import lock, lock_lease
from jaxstow._storage.lock import LOCK_NAME, RemoteLock
from jaxstow._storage.remote_store import RemoteStore
from jaxstow._write.held import hold
from jaxstow.checkpoint import shared
from jaxstow.checkpoint.writing import StepContent
from jaxstow.errors import CheckpointError

pytestmark = pytest.mark.usefixtures("short_leases")


def _taken_over(url: str, options: dict) -> None:
    """Another host's writer takes the lock over, as it does once this one renewed it for one and a half leases."""
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.pipe_file(f"{root}/{LOCK_NAME}", elsewhere().to_json())


def _others_step(url: str, options: dict, step: int, value: float) -> None:
    """The other host's writer saves ``step`` (item ``w``) whole: its files and its record."""
    from jaxstow._storage.settings import StorageSettings

    store = RemoteStore(url, marker=RECORD_NAME, settings=StorageSettings(options=options or None))
    content = StepContent(step, {"w": hold(jnp.full(2, value))}, False, metrics=None, metadata=None)
    talk = Coordinator(store.location, timeout=60).conversation("save")
    shared.commit_content(talk, store, str(step), content, f"step {step}", False, shared=True)


@pytest.mark.parametrize("where", ["memory", "s3"])
def test_a_late_commit_of_a_step_the_other_writer_saved_meanwhile_is_refused_and_its_step_kept(
    where, request, monkeypatch
):
    monkeypatch.setattr(lock_lease, "LEASE_SECONDS", 10.0)  # renewed in time on a loaded machine; nothing waits it out
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        url, options = server.url(f"late-{uuid.uuid4().hex[:8]}"), server.storage_options
    else:
        url, options = f"memory://jaxstow-tests/late-{uuid.uuid4().hex}", {}
    manager = CheckpointManager(url, storage_options=options or None)
    for step in range(3):
        manager.save(step, {"w": jnp.full(2, float(step))})
    manager.wait()
    making, stopped = shared.record_of, []

    def held_up(*args, **kwargs):  # after its lock was last checked, before its record is written
        if not stopped:
            stopped.append(True)
            _taken_over(url, options)
            _others_step(url, options, 3, -3.0)  # (its own record made as ever)
        return making(*args, **kwargs)

    monkeypatch.setattr(shared, "record_of", held_up)
    manager.save(3, {"w": jnp.full(2, 3.0)})
    with pytest.raises(CheckpointError, match="committed by another writer while this one wrote it"):
        manager.wait()
    monkeypatch.setattr(shared, "record_of", making)
    manager.close()
    with CheckpointManager(url, storage_options=options or None) as restarted:  # a reader: it takes no lock
        assert restarted.damaged_steps() == {}
        np.testing.assert_array_equal(restarted.restore(3)["w"], [-3.0, -3.0])
        np.testing.assert_array_equal(restarted.restore(2)["w"], [2.0, 2.0])


def test_a_writer_whose_lock_is_lost_while_it_keeps_steps_deletes_no_more(monkeypatch):
    url = f"memory://jaxstow-tests/keep-{uuid.uuid4().hex}"
    manager = CheckpointManager(url, keep=KeepPolicy(keep_last=1))
    manager.save(0, {"w": jnp.zeros(2)})
    manager.wait()
    keeping = manager._after_commit
    monkeypatch.setattr(manager, "_after_commit", lambda record: iter(()))  # steps 1 to 3 kept, for now
    for step in range(1, 4):
        manager.save(step, {"w": jnp.full(2, float(step))})
    manager.wait()
    monkeypatch.setattr(manager, "_after_commit", keeping)
    store = manager._store
    deleting = type(store).delete

    def delete(self, name):  # the first deletion takes long enough for another host to take the lock over
        deleting(self, name)
        _taken_over(url, {})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                manager._lock.check_held()
            except CheckpointError:
                return
            threading.Event().wait(LEASE / 8)

    monkeypatch.setattr(type(store), "delete", delete)
    manager.save(4, {"w": jnp.full(2, 4.0)})
    with pytest.raises(CheckpointError, match="no longer holds the writer's lock"):
        manager.wait()
    monkeypatch.setattr(type(store), "delete", deleting)
    assert sorted(int(name) for name in store.committed()) == [1, 2, 3, 4]  # step 0 deleted, then none
    manager.close()


def test_a_lock_object_not_found_for_a_moment_at_release_is_deleted_still(monkeypatch):
    reading, missing = lock.read_small, [0]

    def read(*args, **kwargs):
        if missing[0]:
            missing[0] -= 1
            raise FileNotFoundError("no such key")
        return reading(*args, **kwargs)

    monkeypatch.setattr(lock, "read_small", read)
    store = RemoteStore(f"memory://jaxstow-tests/release-{uuid.uuid4().hex}", marker=RECORD_NAME)
    store.ensure()
    held = RemoteLock(store)
    missing[0] = 1
    held.release()
    assert not store.fs.exists(store.path(LOCK_NAME))
    again = RemoteLock(store)  # no lock object left to refuse the next writer
    again.release()
