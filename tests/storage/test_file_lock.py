"""jaxstow's one local lock, ``FileLock``, as its two users hold it: the checkpoint writer's ``.jaxstow.lock`` and the
HDF5 writers' ``<file>.lock`` (real processes that hold it, exit or are killed)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import jaxstow
from jaxstow._storage.lock import LOCK_NAME, FileLock, Holder, LocalLock
from jaxstow.errors import CheckpointError, JaxstowError, PathError
from jaxstow.io.swmr import WriterLock

SOURCES = str(Path(jaxstow.__file__).parents[1])


def _holding(statement: str) -> subprocess.Popen[str]:
    """A process that runs ``statement`` (which takes a lock), says so, and waits to be killed."""
    script = f"import sys\n{statement}\nprint('held', flush=True)\nsys.stdin.read()\n"
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": SOURCES},
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def _refused(holder: Holder | None) -> JaxstowError:
    return CheckpointError(f"held by {holder.pid if holder else None}")


def test_both_users_are_refused_by_the_same_lock_held_by_another_process(tmp_path: Path) -> None:
    """A ``FileLock`` taken in another process keeps out the checkpoint writer and the HDF5 writer alike, and each
    names that process in its own words."""
    samples = tmp_path / "samples.h5"
    holder = _holding(
        "from jaxstow._storage.lock import FileLock\n"
        f"a = FileLock({str(tmp_path / LOCK_NAME)!r}, None)\n"
        f"b = FileLock({str(samples) + '.lock'!r}, None)"
    )
    try:
        with pytest.raises(
            CheckpointError, match=rf"being written by another checkpoint manager \(process {holder.pid} "
        ):
            LocalLock(str(tmp_path))
        with pytest.raises(
            CheckpointError, match=rf"samples\.h5 is being written by another run \(process {holder.pid}\)"
        ):
            WriterLock(samples)
    finally:
        holder.kill()
        holder.wait()
    WriterLock(samples).release()  # free once its holder is gone


def test_a_killed_holder_leaves_its_lock_file_which_the_next_holder_finds(tmp_path: Path, caplog) -> None:
    holder = _holding(
        f"from jaxstow._storage.lock import LocalLock\nfrom jaxstow.io.swmr import WriterLock\n"
        f"a = LocalLock({str(tmp_path)!r})\nb = WriterLock({str(tmp_path / 'samples.h5')!r})"
    )
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with caplog.at_level(logging.WARNING, logger="jaxstow._storage.lock"):
        LocalLock(str(tmp_path)).release()
    assert f"taking over the lock of process {holder.pid} on host" in caplog.text
    lock = WriterLock(tmp_path / "samples.h5")
    assert lock.killed
    lock.release()
    assert sorted(os.listdir(tmp_path)) == []


def test_at_exit_the_checkpoint_lock_is_released_and_the_hdf5_writers_lock_file_stays(tmp_path: Path) -> None:
    """A process that exits holding both: the checkpoint directory is free and clean, while the HDF5 file's lock file
    tells the next writer that the last one never released it (its writer flags may be left set)."""
    script = textwrap.dedent(
        f"""
        from jaxstow._storage.lock import LocalLock
        from jaxstow.io.swmr import WriterLock
        a = LocalLock({str(tmp_path)!r})
        b = WriterLock({str(tmp_path / "samples.h5")!r})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONPATH": SOURCES}, timeout=120)
    assert sorted(os.listdir(tmp_path)) == ["samples.h5.lock"]
    lock = WriterLock(tmp_path / "samples.h5")
    assert lock.killed
    lock.release()


def test_a_holder_that_gives_up_leaves_the_lock_file_as_found(tmp_path: Path) -> None:
    path = str(tmp_path / "x.lock")
    left = Holder(12345, "elsewhere", "2020-01-01T00:00:00+00:00", "0" * 16).to_json()
    Path(path).write_bytes(left)
    lock = FileLock(path, _refused)
    assert lock.found == left and lock.previous == Holder.parse(left)
    assert Holder.parse(Path(path).read_bytes()) is not None and Holder.parse(Path(path).read_bytes()).is_me()
    with pytest.raises(CheckpointError, match=f"held by {os.getpid()}"):
        FileLock(path, _refused)  # another descriptor of this process is refused too: flock is per open file
    lock.release(as_found=True)
    lock.release()  # idempotent
    assert Path(path).read_bytes() == left
    fresh = FileLock(path, _refused)
    fresh.release(as_found=True)  # gives up, but its lock file was found: as found
    assert Path(path).read_bytes() == left
    os.unlink(path)
    new = FileLock(path, _refused)
    assert new.found == b"" and new.previous is None
    new.release(as_found=True)  # nothing was found: nothing is left
    assert not os.path.exists(path)


def test_a_lock_file_that_is_a_link_is_refused_and_what_it_leads_to_is_left_as_it_was(tmp_path: Path) -> None:
    run, notes = tmp_path / "run", tmp_path / "notes.txt"
    run.mkdir()
    notes.write_text("my notes\n")
    (run / LOCK_NAME).symlink_to(notes)
    manager = jaxstow.CheckpointManager(run)
    with pytest.raises(PathError, match=r"is a link to .*notes\.txt: the lock's holder is written into") as caught:
        manager.save(1, {"w": np.zeros(2)})
    manager.close()
    assert caught.value.file == str(run / LOCK_NAME) and f"rm '{run / LOCK_NAME}'" in str(caught.value)
    samples = tmp_path / "samples.h5"
    Path(f"{samples}.lock").symlink_to(notes)
    with pytest.raises(PathError, match=r"samples\.h5\.lock: is a link to .*notes\.txt"):
        WriterLock(samples)
    assert notes.read_text() == "my notes\n" and (run / LOCK_NAME).is_symlink() and Path(f"{samples}.lock").is_symlink()


def test_a_lock_file_with_another_name_elsewhere_is_refused(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    (tmp_path / "run").mkdir()
    os.link(notes, tmp_path / "run" / LOCK_NAME)
    with pytest.raises(PathError, match=r"is a file with 2 names \(hard links\), the others elsewhere"):
        LocalLock(str(tmp_path / "run"))
    os.mkfifo(tmp_path / "fifo.lock")
    with pytest.raises(PathError, match=r"fifo\.lock: is a FIFO \(a named pipe\), not a regular file"):
        FileLock(str(tmp_path / "fifo.lock"), _refused)
    assert notes.read_text() == "my notes\n"
