"""A checkpoint folder named by a relative path stays the folder it named when the manager was made: a process that
changes its working directory later (a notebook's ``%cd``, a library that ``chdir``s) neither saves into, restores
from, nor prunes another run's folder of the same relative name."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow._storage.lock import LOCK_NAME
from jaxstow.objax import TreeCheckpoint


def _steps(folder) -> list[int]:
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


@pytest.fixture
def two_places(tmp_path, monkeypatch):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    monkeypatch.chdir(theirs)
    with CheckpointManager("runs/x") as other_run:  # another run's folder, under the same relative name
        for step in range(1, 5):
            other_run.save(step, {"w": np.full(3, -step)}, metrics={"loss": float(step)})
    monkeypatch.chdir(ours)
    return ours, theirs


def test_a_manager_keeps_to_its_folder_when_the_working_directory_changes(two_places, monkeypatch):
    ours, theirs = two_places
    manager = CheckpointManager("runs/x", keep=KeepPolicy(keep_last=2))
    manager.save(1, {"w": np.full(3, 1)})
    manager.wait()
    monkeypatch.chdir(theirs)
    manager.save(2, {"w": np.full(3, 2)})
    manager.save(3, {"w": np.full(3, 3)})
    manager.wait()
    assert manager.latest_step() == 3
    np.testing.assert_array_equal(manager.restore()["w"], np.full(3, 3))
    manager.close()
    assert _steps(ours / "runs/x") == [2, 3]
    assert _steps(theirs / "runs/x") == [1, 2, 3, 4]  # the other run's steps, all kept and unchanged
    with CheckpointManager(theirs / "runs/x") as other_run:
        np.testing.assert_array_equal(other_run.restore(2)["w"], np.full(3, -2))
    assert not (ours / "runs/x" / LOCK_NAME).exists()  # the lock released where it was taken


def test_objax_tree_checkpoints_keep_to_their_folder_when_the_working_directory_changes(tmp_path, monkeypatch):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    monkeypatch.chdir(ours)
    checkpoint = TreeCheckpoint("ckpt", keep_ckpts=2)
    checkpoint.save({"w": np.zeros(2)}, idx=1)
    monkeypatch.chdir(theirs)
    checkpoint.save({"w": np.ones(2)}, idx=2)
    assert os.listdir(ours / "ckpt") and not (theirs / "ckpt").exists()
    tree, idx, path = checkpoint.restore()
    assert idx == 2 and path.startswith(str(ours))
    np.testing.assert_array_equal(tree["w"], np.ones(2))
