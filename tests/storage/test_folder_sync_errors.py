"""A step whose files are written whole but whose run folder cannot be fsynced after the commit's rename (a failing
device's I/O error): the save fails, and the step stays as it was before, as the error says, in the manager that
saved and in a new one.

The run folder's fsync fails as a failing device's would (``tests/support/failing_fsync.py``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from failing_fsync import failing_fsync

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.errors import CheckpointStorageError


@pytest.fixture
def failing_sync(monkeypatch: pytest.MonkeyPatch):
    return failing_fsync(monkeypatch)


def _values(manager: CheckpointManager) -> dict[int, list[float]]:
    return {step: manager.restore(step, as_numpy=True)["w"].tolist() for step in manager.steps()}


def test_a_step_whose_folder_cannot_be_synced_is_not_left_committed_and_saves_again(tmp_path: Path, failing_sync):
    root = tmp_path / "run"
    manager = CheckpointManager(root, keep=KeepPolicy(keep_last=1))
    manager.save(1, {"w": np.ones(3)})
    manager.wait()
    failing_sync(root)
    manager.save(2, {"w": np.full(3, 2.0)})
    with pytest.raises(CheckpointStorageError, match=f"{root / '2'}: cannot write it: I/O error") as caught:
        manager.wait()
    assert caught.value.errno == errno.EIO
    assert manager.steps() == [1] and sorted(os.listdir(root)) == [".jaxstow.lock", "1"]
    failing_sync(None)
    manager.save(2, {"w": np.full(3, 2.0)})  # the step said to have failed is saved again, not "already exists"
    manager.close()
    assert _values(CheckpointManager(root)) == {2: [2.0] * 3}


def test_a_replaced_step_whose_folder_cannot_be_synced_keeps_its_values_and_reads_intact(tmp_path: Path, failing_sync):
    root = tmp_path / "run"
    manager = CheckpointManager(root)
    manager.save(1, {"w": np.ones(3)})
    manager.wait()
    failing_sync(root)
    manager.save(1, {"w": np.full(3, 7.0)}, force=True)
    with pytest.raises(CheckpointStorageError, match=f"{root / '1'}: cannot write it: I/O error"):
        manager.wait()
    failing_sync(None)
    assert _values(manager) == {1: [1.0] * 3} and manager.damaged_steps() == {}  # not taken for a damaged step
    manager.close()
    reopened = CheckpointManager(root)
    assert _values(reopened) == {1: [1.0] * 3} and sorted(os.listdir(root)) == ["1"]
