"""CheckpointManager settings given values they do not take: an ``ArgumentError`` at construction, naming the
setting and what it takes, never a value taken for True, a foreign error, nor a manager that fails at its first save."""

from __future__ import annotations

import numpy as np
import pytest

from jaxstow import CheckpointManager, LocalTier
from jaxstow.errors import ArgumentError


@pytest.mark.parametrize("value", [float("inf"), 1e300, 2**31, 0, -1, float("nan")])
def test_a_process_timeout_jax_cannot_wait_for_is_refused(tmp_path, value):
    with pytest.raises(ArgumentError, match="process_timeout must be a positive number of seconds, at most 2147483"):
        CheckpointManager(tmp_path / "run", process_timeout=value)


@pytest.mark.parametrize("value", ["false", "yes", 1, 0.0])
def test_broadcast_restore_takes_true_false_or_none(tmp_path, value):
    with pytest.raises(ArgumentError, match="broadcast_restore takes True, False or None"):
        CheckpointManager(tmp_path / "run", broadcast_restore=value)
    for taken in (True, False, None, np.True_):
        CheckpointManager(tmp_path / "run", broadcast_restore=taken).close()


@pytest.mark.parametrize("directory", [None, 3, b"/tmp/x", ""])
def test_a_local_tier_whose_directory_is_no_path_is_refused(directory):
    with pytest.raises(ArgumentError, match="LocalTier's directory must be a local path"):
        LocalTier(directory)


def test_a_local_tier_in_the_checkpoint_directory_itself_is_refused_and_one_inside_it_works(tmp_path):
    with pytest.raises(ArgumentError, match="is the checkpoint directory itself"):
        CheckpointManager(tmp_path / "run", local=LocalTier(tmp_path / "run"))
    (tmp_path / "alias").symlink_to(tmp_path / "run")  # was "being written by another checkpoint manager" (itself)
    with pytest.raises(ArgumentError, match="is the checkpoint directory itself"):
        CheckpointManager(tmp_path / "run", local=LocalTier(tmp_path / "alias"))
    with CheckpointManager(tmp_path / "run", local=LocalTier(tmp_path / "run" / "local")) as manager:
        manager.save(1, {"w": np.ones(2)})
        manager.wait()
        np.testing.assert_array_equal(manager.restore(1, as_numpy=True)["w"], np.ones(2))


def test_the_advice_for_a_local_tier_option_without_a_local_tier_is_one_that_works(tmp_path):
    with pytest.raises(ArgumentError) as refused:
        CheckpointManager(tmp_path / "run", local_save_every=5, local_keep_last=3)
    advice = "LocalTier(directory, save_every=5, keep_last=3)"
    assert f"pass local={advice}" in str(refused.value)
    LocalTier(tmp_path / "ssd", save_every=5, keep_last=3)  # the advice, followed


def test_the_constructor_shows_its_twelve_settings_and_still_takes_the_deprecated_shortcuts(tmp_path):
    import inspect
    import warnings

    parameters = inspect.signature(CheckpointManager).parameters
    assert len(parameters) == 12 and list(parameters)[:3] == ["directory", "save_every", "keep"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CheckpointManager(tmp_path / "run", keep_last=2).close()
    assert any("keep_last=2" in str(warning.message) for warning in caught)
