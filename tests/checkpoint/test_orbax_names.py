"""A manager's methods called by orbax's names: the AttributeError names jaxstow's call; other names are as Python's."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from jaxstow import CheckpointManager


@pytest.mark.parametrize(("orbax", "jaxstow"), [("wait_until_finished", "wait()"), ("all_steps", "steps()")])
def test_an_orbax_name_says_what_jaxstow_calls_it(tmp_path, orbax, jaxstow):
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"w": np.ones(2)})
        with pytest.raises(AttributeError, match=rf"'{orbax}' \(orbax's name\): use manager\.{jaxstow}") as raised:
            getattr(manager, orbax)()
        assert raised.value.name == orbax and raised.value.obj is manager
        assert manager.steps() == [1]


def test_any_other_missing_name_is_a_plain_attribute_error(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager:
        assert not hasattr(manager, "wait_until_done")
        with pytest.raises(AttributeError, match=r"^'CheckpointManager' object has no attribute 'lastest_step'$"):
            manager.lastest_step()  # type: ignore[attr-defined]  # a type checker says so too
        with pytest.raises((TypeError, pickle.PicklingError)):  # pickle's protocol names are not taken for orbax's
            pickle.dumps(manager)
