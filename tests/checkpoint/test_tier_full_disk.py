"""A step saved again with ``force=True`` under a local tier, whose copy to a full persistent directory fails: the step
keeps its old values in both tiers, as a failed save leaves a step; before, the local tier kept the new values, restored
until it pruned them, and the old ones after. The persistent directory is a small tmpfs
(``tests/support/tmpfs.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from tmpfs import leftovers, small_tmpfs

from jaxstow import CheckpointManager, LocalTier
from jaxstow.errors import StorageError


def _state(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(250_000, value, np.float32)}  # 1 MB


def test_a_forced_save_whose_persistent_copy_fails_leaves_the_step_as_it_was_in_both_tiers(tmp_path):
    with small_tmpfs(tmp_path / "small", "4m") as disk:
        with CheckpointManager(disk / "run", local=LocalTier(tmp_path / "local", keep_last=2)) as manager:
            manager.save(1, _state(1.0))
            manager.save(2, _state(2.0))
            manager.wait()
            filler = disk / "filler"
            filler.write_bytes(bytes(1_500_000))  # less room than a copy of step 2 takes
            manager.save(2, _state(20.0), force=True)
            with pytest.raises(StorageError, match=f"copying step 2 from .*no space left on the device holding {disk}"):
                manager.wait()
            assert manager.steps(tier="local") == [1] and manager.steps(tier="persistent") == [1, 2]
            np.testing.assert_array_equal(manager.restore(2, as_numpy=True)["w"], _state(2.0)["w"])
            filler.unlink()
            manager.save(2, _state(20.0), force=True)  # saved again, with room: new values in both tiers
            manager.wait()
            np.testing.assert_array_equal(manager.restore(2, as_numpy=True)["w"], _state(20.0)["w"])
        np.testing.assert_array_equal(CheckpointManager(disk / "run").restore(2, as_numpy=True)["w"], _state(20.0)["w"])
        assert leftovers(disk) == [] and leftovers(tmp_path / "local") == []
