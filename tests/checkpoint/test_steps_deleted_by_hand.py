"""Step folders deleted by hand while a manager writes the run (``rm -r run/3`` to free a full disk): the manager lists,
restores and keeps by policy the steps that are there, and its saves go on; before, it went on listing the deleted
steps, took the newest for a damaged one, and every later save failed deleting a step no longer there."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from tmpfs import leftovers, small_tmpfs

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.errors import StorageError


def _state(step: int) -> dict[str, np.ndarray]:
    return {"w": np.full(100_000, step, np.float32)}  # 400 kB


def test_steps_deleted_by_hand_are_gone_from_the_manager_and_its_saves_go_on(tmp_path):
    folder = tmp_path / "run"
    with CheckpointManager(folder, keep=KeepPolicy(keep_last=3)) as manager:
        for step in range(1, 6):
            manager.save(step, _state(step))
        manager.wait()
        shutil.rmtree(folder / "3")  # the oldest step kept and the newest, by hand
        shutil.rmtree(folder / "5")
        assert manager.steps() == [4] and manager.latest_step() == 4
        np.testing.assert_array_equal(manager.restore(as_numpy=True)["w"], _state(4)["w"])
        for step in (6, 7, 8):
            manager.save(step, _state(step))
            manager.wait()
        assert manager.steps() == [6, 7, 8]
    assert CheckpointManager(folder).steps() == [6, 7, 8]


def test_a_full_disk_freed_by_hand_takes_the_next_saves(tmp_path):
    with small_tmpfs(tmp_path / "small", "2m") as disk:
        folder = disk / "run"
        with CheckpointManager(folder, keep=KeepPolicy(keep_last=5)) as manager:
            with pytest.raises(StorageError, match="no space left on the device"):
                for step in range(1, 10):
                    manager.save(step, _state(step))
                    manager.wait()
            full = manager.steps()
            for step in full[:-1]:
                shutil.rmtree(folder / str(step))
            assert manager.steps() == full[-1:]
            for step in range(full[-1] + 1, full[-1] + 4):
                manager.save(step, _state(step))
                manager.wait()
            kept = manager.steps()
        assert kept == [full[-1], full[-1] + 1, full[-1] + 2, full[-1] + 3] and leftovers(disk) == []
        again = CheckpointManager(folder)
        for step in kept:
            np.testing.assert_array_equal(again.restore(step, as_numpy=True)["w"], _state(step)["w"])
