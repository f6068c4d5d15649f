"""The writer's lock of a checkpoint directory: one holder at a time, named in the refusal; a holder killed with
SIGKILL frees it at once; locally an ``flock``, on an object store a lock object created only if absent."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid

import pytest

from jaxstow._storage.folders import LocalStore
from jaxstow._storage.lock import LOCK_NAME, Holder, LocalLock, RemoteLock, lock_store
from jaxstow._storage.remote_store import RemoteStore
from jaxstow.errors import CheckpointError

_HOLDER = """
import sys, time
from jaxstow._storage.lock import LocalLock
lock = LocalLock(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)


def test_a_second_writer_is_refused_naming_the_first_until_it_releases(tmp_path):
    lock = LocalLock(str(tmp_path))
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
    with pytest.raises(CheckpointError, match="is being written by another checkpoint manager") as caught:
        LocalLock(str(tmp_path))
    assert f"(process {os.getpid()} on host {socket.gethostname()} since {holder['since']})" in str(caught.value)
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()
    lock.release()  # idempotent
    LocalLock(str(tmp_path)).release()


def test_a_lock_no_one_refers_to_is_released(tmp_path):
    LocalLock(str(tmp_path))  # collected at once: its finalizer releases it
    assert not (tmp_path / LOCK_NAME).exists()
    LocalLock(str(tmp_path)).release()


def test_a_live_holder_in_another_process_is_refused_and_its_lock_is_free_once_it_is_killed(tmp_path, caplog):
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "locked\n"
        with pytest.raises(CheckpointError, match=f"process {process.pid} on host"):
            LocalLock(str(tmp_path))
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == process.pid  # the file stays; its flock went
    with caplog.at_level(logging.WARNING, logger="jaxstow._storage.lock"):
        lock = LocalLock(str(tmp_path))
    assert f"taking over the lock of process {process.pid} on host" in caplog.text
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_holders_are_parsed_from_what_they_wrote_and_garbage_is_no_holder():
    me = Holder.me()
    assert Holder.parse(me.to_json()) == me
    for garbage in (b"", b"{", b"[]", b'{"pid": "x", "host": "h", "since": "s", "token": "t"}', b'{"pid": 1}'):
        assert Holder.parse(garbage) is None
    assert not me.is_gone()
    assert Holder(_dead_pid(), socket.gethostname(), "", "").is_gone()
    assert not Holder(_dead_pid(), socket.gethostname() + "-elsewhere", "", "").is_gone()  # not this host's to say
    assert Holder.parse(b'{"pid": 99999999999999999999, "host": "h", "since": "s", "token": "t"}') is None


def test_a_holder_in_another_pid_namespace_is_never_taken_for_gone():
    # A container with the host's name but its own PID namespace (docker --network=host) saw a live writer's pid as
    # free, took its object-store lock over and aborted its uploads.
    other = Holder(_dead_pid(), socket.gethostname(), "", "", pid_space="pid:[1]")
    assert not other.is_gone() and not other.is_me()
    assert "in another PID namespace" in other.describe()
    assert Holder.parse(other.to_json()) == other


def test_a_holder_of_another_machine_of_the_same_name_is_never_taken_for_gone_one_of_this_one_restarted_is():
    # Two machines named localhost share the first PID namespace's id: a live writer of the other, whose pid ran
    # nothing here, was called gone and its object-store lock taken over.
    me = Holder.me()
    other_machine = dataclasses.replace(me, pid=_dead_pid(), boot="another-boot", machine="another-machine")
    assert not other_machine.is_gone() and not other_machine.is_me()
    assert not other_machine.left("/nonexistent")
    assert "of another machine of that name, or of this one before it restarted" in other_machine.describe()
    restarted = dataclasses.replace(other_machine, machine=me.machine)
    assert restarted.is_gone() == bool(me.machine)
    assert Holder.parse(other_machine.to_json()) == other_machine
    store = _remote_store()
    store.ensure()
    store.fs.pipe_file(store.path(LOCK_NAME), other_machine.to_json())
    with pytest.raises(CheckpointError, match=f"process {other_machine.pid} on host {me.host} .*another machine"):
        RemoteLock(store)


def _remote_store() -> RemoteStore:
    return RemoteStore(f"memory://jaxstow-tests/lock-{uuid.uuid4().hex}", marker="checkpoint.json")


def test_on_an_object_store_the_lock_object_refuses_a_second_writer_and_goes_at_release():
    store = _remote_store()
    lock = lock_store(store)
    assert isinstance(lock, RemoteLock)
    assert Holder.parse(store.fs.cat_file(store.path(LOCK_NAME))) is not None
    with pytest.raises(CheckpointError, match=f"process {os.getpid()} on host .*delete {store.url(LOCK_NAME)}"):
        RemoteLock(store)
    lock.release()
    assert not store.fs.exists(store.path(LOCK_NAME))
    lock_store(store).release()


def test_on_an_object_store_the_lock_of_a_gone_process_is_taken_over_and_another_hosts_is_not(caplog):
    store = _remote_store()
    store.ensure()
    gone = Holder(_dead_pid(), socket.gethostname(), "2024-01-01T00:00:00+00:00", "0" * 16)
    store.fs.pipe_file(store.path(LOCK_NAME), gone.to_json())
    with caplog.at_level(logging.WARNING, logger="jaxstow._storage.lock"):
        lock = RemoteLock(store)
    assert f"taking over the lock of process {gone.pid}" in caplog.text
    assert Holder.parse(store.fs.cat_file(store.path(LOCK_NAME))).pid == os.getpid()
    lock.release()
    elsewhere = Holder(gone.pid, "another-host", gone.since, gone.token)
    store.fs.pipe_file(store.path(LOCK_NAME), elsewhere.to_json())
    with pytest.raises(CheckpointError, match=f"process {gone.pid} on host another-host"):
        RemoteLock(store)
    lock.release()  # not this lock's object any more: left in place
    assert Holder.parse(store.fs.cat_file(store.path(LOCK_NAME))) == elsewhere


def test_a_local_store_gets_a_local_lock_in_its_folder_created_if_needed(tmp_path):
    lock = lock_store(LocalStore(str(tmp_path / "new" / "run"), marker="checkpoint.json"))
    assert isinstance(lock, LocalLock) and (tmp_path / "new" / "run" / LOCK_NAME).exists()
    lock.release()


def test_a_lock_left_by_another_host_whose_pid_runs_here_is_taken_over_locally_with_a_warning_and_refused_remotely(
    tmp_path, caplog
):
    # A run restarted on a new host of a shared file system: the lock file names the old host's writer, whose pid a
    # live process of this host happens to have. The flock is free: the lock is taken, and the takeover is told.
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lock_file = tmp_path / LOCK_NAME
        lock_file.touch()
        old = Holder(live.pid, "old-host", "2024-01-01T00:00:00+00:00", "0" * 16, inode=lock_file.stat().st_ino)
        lock_file.write_bytes(old.to_json())
        with caplog.at_level(logging.WARNING, logger="jaxstow._storage.lock"):
            lock = LocalLock(str(tmp_path))
        assert f"taking over the lock of process {live.pid} on host old-host since 2024-01-01" in caplog.text
        assert Holder.parse(lock_file.read_bytes()).pid == os.getpid()
        lock.release()
        store = _remote_store()
        store.ensure()
        store.fs.pipe_file(store.path(LOCK_NAME), old.to_json())  # an object store cannot tell: the writer may run
        with pytest.raises(
            CheckpointError, match=f"process {live.pid} on host old-host .*delete {store.url(LOCK_NAME)}"
        ):
            RemoteLock(store)
    finally:
        live.kill()
        live.wait(timeout=60)
