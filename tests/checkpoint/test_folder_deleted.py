"""A run's folder deleted (or moved) by its user while a manager writes there: the next save says so, and how to go
on, rather than a bare "no such file or folder"; a new manager makes the folder again."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow.errors import CheckpointError


def test_a_save_after_the_folder_was_deleted_says_so_and_a_new_manager_saves_there_again(tmp_path):
    folder = tmp_path / "run"
    manager = CheckpointManager(folder)
    manager.save(1, {"w": np.arange(3.0)})
    manager.wait()
    shutil.rmtree(folder)
    manager.save(2, {"w": np.arange(3.0)})
    with pytest.raises(CheckpointError) as raised:
        manager.close()
    message = str(raised.value)
    assert f"{folder}/2: cannot write it: the folder {folder} is gone, deleted or moved" in message, message
    assert "open a new one, which makes the folder again" in message, message
    assert not folder.exists()
    with CheckpointManager(folder) as again:
        again.save(2, {"w": np.arange(3.0)})
    assert CheckpointManager(folder).steps() == [2]
