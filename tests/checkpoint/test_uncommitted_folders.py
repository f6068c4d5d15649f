"""A step's folder that holds files but no record (a copy of a run cut short) is not a step: saving that step tells
the user to move it away, and leaves its files as they were."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow.errors import CheckpointError


def test_saving_a_step_over_an_uncommitted_folder_says_to_move_it_away(tmp_path):
    run = tmp_path / "run"
    with CheckpointManager(run) as manager:
        manager.save(1, {"w": np.ones(3)})
        manager.save(2, {"w": np.full(3, 2.0)})
    (run / "2" / "checkpoint.json").unlink()  # the copy was cut short before step 2's record arrived
    manager = CheckpointManager(run)
    assert manager.steps() == [1]
    manager.save(2, {"w": np.full(3, 20.0)})
    with pytest.raises(CheckpointError, match=r"2 holds w\.safetensors but no checkpoint\.json.*move it away"):
        manager.wait()
    assert sorted(path.name for path in (run / "2").iterdir()) == ["w.safetensors"]  # left as it was
    shutil.move(run / "2", tmp_path / "step-2-cut-short")
    manager.save(2, {"w": np.full(3, 20.0)})
    manager.close()
    np.testing.assert_array_equal(CheckpointManager(run).restore(2)["w"], np.full(3, 20.0))
