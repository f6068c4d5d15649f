"""A local tier belongs to the run that first wrote it: another run given the same local directory (a fixed SSD path
in a cluster's job settings) is refused, naming both runs, instead of restoring the first run's steps as its own or
skipping its saves up to the first run's newest step."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from jaxstow import CheckpointManager, LocalTier
from jaxstow.checkpoint.tier_owner import OWNER_NAME
from jaxstow.errors import CheckpointError, CorruptFileError


def _run(persistent, local, steps, value: float) -> None:
    with CheckpointManager(persistent, save_every=10, local=LocalTier(local)) as manager:
        for step in steps:
            if manager.should_save(step):
                manager.save(step, {"w": np.full(2, value)})


def test_another_run_given_the_same_local_directory_is_refused_before_it_reads_or_saves(tmp_path):
    ssd = tmp_path / "ssd"
    _run(tmp_path / "run_a", ssd, range(1, 51), -1.0)
    held = sorted(os.listdir(ssd))
    with pytest.raises(CheckpointError, match=r"holds the steps of the run saved to .*run_a, not to .*run_b") as raised:
        CheckpointManager(tmp_path / "run_b", save_every=10, local=LocalTier(ssd))
    assert "give each run a local directory of its own" in str(raised.value)
    assert sorted(os.listdir(ssd)) == held  # run A's local steps untouched
    assert not (tmp_path / "run_b").exists() or not os.listdir(tmp_path / "run_b")


def test_the_same_run_restarted_restores_from_its_local_tier(tmp_path):
    ssd, persistent = tmp_path / "ssd", tmp_path / "run"
    _run(persistent, ssd, range(1, 16), 1.0)
    with CheckpointManager(persistent, save_every=10, local=LocalTier(ssd)) as manager:
        assert manager.latest_step() == 15 and manager.steps(tier="persistent") == [1, 10]
        np.testing.assert_array_equal(manager.restore()["w"], np.full(2, 1.0))
        assert manager.restored.step == 15  # a step only the local tier holds


def test_the_run_is_told_by_its_folder_not_by_how_the_path_is_spelled(tmp_path, monkeypatch):
    ssd = tmp_path / "ssd"
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path / "run", tmp_path / "link")
    _run(tmp_path / "run", ssd, range(1, 6), 1.0)
    monkeypatch.chdir(tmp_path)
    with CheckpointManager("link", save_every=10, local=LocalTier(ssd)) as manager:  # the same folder, by a link
        assert manager.latest_step() == 5


def test_a_tier_written_before_it_named_its_run_is_taken_as_this_runs(tmp_path):
    ssd, persistent = tmp_path / "ssd", tmp_path / "run"
    _run(persistent, ssd, range(1, 6), 1.0)
    os.remove(ssd / OWNER_NAME)
    with CheckpointManager(persistent, save_every=10, local=LocalTier(ssd)) as manager:
        assert manager.latest_step() == 5
        manager.save(6, {"w": np.full(2, 6.0)})
    assert json.loads((ssd / OWNER_NAME).read_text())["persistent"] == str(persistent)


def test_a_run_moved_with_its_local_tier_restores_from_it(tmp_path):
    _run(tmp_path / "old/run", tmp_path / "old/ssd", range(1, 16), 1.0)
    os.rename(tmp_path / "old", tmp_path / "new")  # the experiment's folder moved (or copied) whole
    with CheckpointManager(tmp_path / "new/run", save_every=10, local=LocalTier(tmp_path / "new/ssd")) as manager:
        assert manager.latest_step() == 15
        manager.save(16, {"w": np.full(2, 16.0)})
    assert json.loads((tmp_path / "new/ssd" / OWNER_NAME).read_text())["persistent"] == str(tmp_path / "new/run")


def test_a_run_moved_without_its_local_tier_is_told_which_steps_only_the_tier_holds(tmp_path):
    ssd = tmp_path / "ssd"
    _run(tmp_path / "old", ssd, range(1, 16), 1.0)  # steps 1 and 10 persistent, 14 and 15 only on the SSD
    os.rename(tmp_path / "old", tmp_path / "new")  # the experiment's folder moved, its local tier left behind
    with pytest.raises(
        CheckpointError, match=r"deleting it loses steps \[14, 15\], which .*new does not hold: .*move it back to .*old"
    ) as raised:
        CheckpointManager(tmp_path / "new", save_every=10, local=LocalTier(ssd))
    assert "its steps are there" not in str(raised.value)  # what it said: deleting the tier then lost 14 and 15
    os.rename(tmp_path / "new", tmp_path / "old")
    with CheckpointManager(tmp_path / "old", save_every=10, local=LocalTier(ssd)) as manager:
        assert manager.latest_step() == 15


def test_a_damaged_record_of_the_tiers_run_is_named(tmp_path):
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    for damaged in ("[1, 2]", "[" * 100_000 + "]" * 100_000):  # not an object; nested past Python's parser
        (ssd / OWNER_NAME).write_text(damaged)
        with pytest.raises(CorruptFileError, match=OWNER_NAME):
            CheckpointManager(tmp_path / "run", local=LocalTier(ssd))


def test_a_run_started_again_at_a_deleted_runs_path_does_not_resume_its_local_tier(tmp_path):
    ssd, persistent = tmp_path / "ssd", tmp_path / "runs" / "exp"
    _run(persistent, ssd, range(1, 16), 1.0)
    shutil.rmtree(persistent)  # "start this experiment over"
    with pytest.raises(CheckpointError, match=r"earlier run saved to .*exp, which has lost every step") as raised:
        CheckpointManager(persistent, save_every=10, local=LocalTier(ssd))
    assert f"delete {ssd}" in str(raised.value)
    os.remove(ssd / OWNER_NAME)  # the way the message gives to go on from the tier's steps
    with CheckpointManager(persistent, save_every=10, local=LocalTier(ssd)) as manager:
        assert manager.latest_step() == 15


def test_a_run_that_crashed_before_its_first_persistent_step_resumes_from_its_local_tier(tmp_path):
    ssd, persistent = tmp_path / "ssd", tmp_path / "run"
    _run(persistent, ssd, range(1, 8), 1.0)  # persistent steps every 10: none yet
    with CheckpointManager(persistent, save_every=10, local=LocalTier(ssd)) as manager:
        assert manager.latest_step() == 7
        np.testing.assert_array_equal(manager.restore(as_numpy=True)["w"], [1.0, 1.0])


def test_a_run_whose_persistent_steps_were_all_deleted_by_its_manager_resumes_from_its_local_tier(tmp_path):
    """Was: refused as an earlier run's tier once the run freed its persistent directory's space with delete()."""
    ssd, persistent = tmp_path / "ssd", tmp_path / "run"
    _run(persistent, ssd, range(1, 16), 1.0)  # steps 1 and 10 persistent, 14 and 15 only on the SSD
    with CheckpointManager(persistent, save_every=10, local=LocalTier(ssd)) as manager:
        for step in (1, 10):
            manager.delete(step)
        assert manager.steps(tier="persistent") == []
    with CheckpointManager(persistent, save_every=10, local=LocalTier(ssd)) as manager:
        assert manager.latest_step() == 15
        np.testing.assert_array_equal(manager.restore(as_numpy=True)["w"], [1.0, 1.0])
        manager.save(20, {"w": np.full(2, 20.0)})  # due in the persistent directory again
    assert CheckpointManager(persistent).steps() == [20]
    shutil.rmtree(persistent)  # the run's directory deleted by hand since: its tier is an earlier run's again
    with pytest.raises(CheckpointError, match=r"earlier run saved to .*run, which has lost every step"):
        CheckpointManager(persistent, save_every=10, local=LocalTier(ssd))
