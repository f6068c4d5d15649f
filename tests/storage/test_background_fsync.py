"""A step's files fsynced in the background while the next are written: the next file is written before the last one's
fsync ends, few files are open at once, and an fsync that fails (a failing device's I/O error, injected: no file
system here fails one on request) fails the save naming the file, with nothing committed and every file closed."""

from __future__ import annotations

import concurrent.futures.thread
import errno
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow._storage.background_fsync import Fsyncs
from jaxstow._storage.folders import LocalStore
from jaxstow.errors import CheckpointStorageError


def _open_under(root: Path) -> list[str]:
    """The files this process holds open under ``root``."""
    found = []
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            continue
        if target.startswith(f"{root}{os.sep}") and not target.endswith(".jaxstow.lock"):
            found.append(target)
    return found


def _items(count: int) -> dict[str, np.ndarray]:
    return {f"l{i:02d}": np.full(1000, i, np.float32) for i in range(count)}


def test_the_next_file_is_written_while_the_last_is_fsynced_and_few_are_open(tmp_path: Path, monkeypatch):
    root = tmp_path / "run"
    real = os.fsync
    seen: dict[str, object] = {"overlap": False, "most_open": 0}

    def fsync(descriptor: int) -> None:
        name = os.readlink(f"/proc/self/fd/{descriptor}")
        if name.endswith("l00.safetensors"):  # held until the next file is there: never, if written one by one
            next_file = Path(name).with_name("l01.safetensors")
            done = threading.Event()
            for _ in range(600):
                if next_file.exists() or done.wait(0.05):
                    seen["overlap"] = next_file.exists()
                    break
        seen["most_open"] = max(int(seen["most_open"]), len(_open_under(root)))  # type: ignore[call-overload]
        real(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    with CheckpointManager(root) as manager:
        manager.save(1, _items(30))
        manager.wait()
        assert manager.steps() == [1]
        assert manager.restore(1, as_numpy=True)["l29"].tolist() == [29.0] * 1000
    assert seen["overlap"], "l01 was written only after l00's fsync"
    assert 1 < int(seen["most_open"]) <= Fsyncs().at_once + 1, seen  # type: ignore[call-overload]
    assert not _open_under(root)


def test_a_file_whose_fsync_fails_fails_the_save_naming_it_with_nothing_committed(tmp_path: Path, monkeypatch):
    root = tmp_path / "run"
    manager = CheckpointManager(root)
    manager.save(1, _items(3))
    manager.wait()
    real = os.fsync

    def fsync(descriptor: int) -> None:
        if os.readlink(f"/proc/self/fd/{descriptor}").endswith("l05.safetensors"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    manager.save(2, _items(12))
    with pytest.raises(CheckpointStorageError, match=f"{root / '2' / 'l05.safetensors'}: cannot write it: I/O error"):
        manager.wait()
    assert manager.steps() == [1] and sorted(os.listdir(root)) == [".jaxstow.lock", "1"]
    assert not _open_under(root)
    monkeypatch.setattr(os, "fsync", real)
    manager.save(2, _items(12))  # saved again, not "already exists"
    manager.close()
    assert CheckpointManager(root).steps() == [1, 2]


def test_every_failure_waits_for_every_file_and_tells_the_first(tmp_path: Path, monkeypatch):
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda descriptor: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
    )
    fsyncs = Fsyncs(at_once=2)
    sinks = []
    for name in "abcde":
        sink = open(tmp_path / name, "wb")  # noqa: SIM115
        sinks.append(sink)
        fsyncs.hand_over(sink, name)
    with pytest.raises(Exception, match="No space left") as caught:
        fsyncs.wait()
    assert caught.value.name == "a" and all(sink.closed for sink in sinks)  # type: ignore[attr-defined]
    monkeypatch.setattr(os, "fsync", real)
    fsyncs.wait()  # told once


def test_where_the_pool_takes_no_more_work_the_file_is_fsynced_on_the_callers_thread(tmp_path: Path, monkeypatch):
    """Once the interpreter exits, pools take no more work (a save finished by an exit handler): each file is fsynced
    by the thread that wrote it, and the folder is committed whole."""
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda descriptor: synced.append(threading.current_thread().name) or real(descriptor)
    )
    monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)  # as at the interpreter's exit
    (tmp_path / "run").mkdir()
    store = LocalStore(str(tmp_path / "run"), marker="done.json")
    staging = store.stage("1", replace=False)
    for name in ("a.bin", "b.bin"):
        with staging.open(name) as (_, sink):
            sink.write(name.encode())
    staging.commit(b"{}")
    assert store.committed() == ["1"] and (tmp_path / "run" / "1" / "b.bin").read_bytes() == b"b.bin"
    assert synced and set(synced) == {threading.current_thread().name}
    assert not _open_under(tmp_path / "run")


def test_a_wait_interrupted_leaves_the_file_in_flight_for_the_next_wait(tmp_path: Path, monkeypatch):
    release = threading.Event()
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda descriptor: release.wait(60) and real(descriptor))
    fsyncs = Fsyncs(at_once=4)
    sink = open(tmp_path / "a", "wb")  # noqa: SIM115
    fsyncs.hand_over(sink, "a")
    timer = threading.Timer(0.2, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        fsyncs.wait()
    assert not sink.closed
    release.set()
    fsyncs.wait()  # waits for it still
    assert sink.closed


def test_a_ctrl_c_while_a_file_waits_to_be_handed_over_leaves_no_file_open(tmp_path: Path, monkeypatch):
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda descriptor: time.sleep(0.3) or real(descriptor))
    root = tmp_path / "run"
    manager = CheckpointManager(root, async_save=False)
    timer = threading.Timer(1.0, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt) as caught:
        manager.save(1, _items(40))  # 8 fsyncs of 0.3 s in flight at most: the 9th file waits to be handed over
    assert not _open_under(root), caught.value  # the traceback still alive
    monkeypatch.setattr(os, "fsync", real)
    manager.save(1, _items(3))
    manager.close()
    assert CheckpointManager(root).steps() == [1]
