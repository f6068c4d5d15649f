"""A run's folder opened through a link that is then pointed at another folder (``runs/current`` moved on to the next
experiment while this one still runs): the manager's next save or delete is refused, naming both folders, instead of
writing its steps, and deleting by its keep policy, in a folder whose writer's lock it does not hold."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.errors import CheckpointError


def test_a_link_pointed_elsewhere_after_the_lock_was_taken_refuses_the_next_save(tmp_path):
    (tmp_path / "exp1").mkdir()
    link = tmp_path / "current"
    link.symlink_to(tmp_path / "exp1")
    manager = CheckpointManager(link, keep=KeepPolicy(keep_last=1))
    manager.save(1, {"w": np.ones(2)})
    manager.wait()
    with CheckpointManager(tmp_path / "exp2") as other:  # the next experiment, written by a manager of its own
        other.save(10, {"w": np.zeros(2)})
        link.unlink()
        link.symlink_to(tmp_path / "exp2")
        for call in (lambda: manager.save(2, {"w": np.full(2, 2.0)}), lambda: manager.delete(1)):
            with pytest.raises(CheckpointError) as raised:
                call()
            message = str(raised.value)
            exp1, exp2 = os.path.realpath(tmp_path / "exp1"), os.path.realpath(tmp_path / "exp2")
            assert f"{link} now leads to {exp2}, not to {exp1}, the folder whose writer's lock" in message, message
            assert "Close this manager" in message, message
        other.save(11, {"w": np.zeros(2)})
    manager.close()
    assert CheckpointManager(tmp_path / "exp2").steps() == [10, 11]
    with CheckpointManager(tmp_path / "exp1") as first:  # its lock released: the run goes on there
        assert first.steps() == [1]
        first.save(2, {"w": np.full(2, 2.0)})
    with CheckpointManager(link) as again:  # opened again, it writes where the link leads now
        again.save(12, {"w": np.zeros(2)})
    assert CheckpointManager(tmp_path / "exp2").steps() == [10, 11, 12]
