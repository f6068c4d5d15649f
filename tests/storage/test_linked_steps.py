"""A step folder that is a link (a step archived on another disk and linked back into the run's folder): it restores
as any step, and the keep policy that prunes it removes the link, never what it points to, and saves on. An item file
that is a link is read only where it leads within its step's folder."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.errors import PathError


def test_a_linked_step_pruned_loses_its_link_and_keeps_its_archive(tmp_path):
    run, archive = tmp_path / "run", tmp_path / "archive"
    with CheckpointManager(run) as manager:
        for step in (1, 2, 3):
            manager.save(step, {"w": np.full(2, float(step))})
    archive.mkdir()
    shutil.move(run / "1", archive / "1")
    os.symlink(archive / "1", run / "1")
    with CheckpointManager(run, keep=KeepPolicy(keep_last=2)) as manager:
        np.testing.assert_array_equal(manager.restore(1)["w"], np.full(2, 1.0))
        manager.save(4, {"w": np.full(2, 4.0)})
        manager.wait()
        assert manager.steps() == [3, 4]
    assert sorted(os.listdir(run)) == ["3", "4"]  # no link, no leftover under a temporary name
    assert sorted(os.listdir(archive / "1")) == ["checkpoint.json", "w.safetensors"]
    with CheckpointManager(archive.parent / "archive") as archived:
        np.testing.assert_array_equal(archived.restore(1)["w"], np.full(2, 1.0))


def test_an_item_file_linked_outside_its_step_is_refused_and_one_linked_inside_is_read(tmp_path):
    run = tmp_path / "run"
    with CheckpointManager(run) as manager:
        manager.save(1, {"w": np.arange(2.0)})
    os.rename(run / "1" / "w.safetensors", tmp_path / "elsewhere.safetensors")
    os.symlink(tmp_path / "elsewhere.safetensors", run / "1" / "w.safetensors")
    with pytest.raises(PathError, match=r"w\.safetensors: is a link to .*elsewhere\.safetensors, outside the step's"):
        CheckpointManager(run).restore(1)
    os.rename(tmp_path / "elsewhere.safetensors", run / "1" / "kept.safetensors")
    os.unlink(run / "1" / "w.safetensors")
    os.symlink("kept.safetensors", run / "1" / "w.safetensors")
    np.testing.assert_array_equal(CheckpointManager(run).restore(1)["w"], np.arange(2.0))


def test_a_linked_step_replaced_is_saved_and_keeps_its_archive(tmp_path):
    run, archive = tmp_path / "run", tmp_path / "archive"
    with CheckpointManager(run) as manager:
        manager.save(1, {"w": np.zeros(2)})
    shutil.move(run / "1", archive)
    os.symlink(archive, run / "1")
    with CheckpointManager(run) as manager:
        manager.save(1, {"w": np.ones(2)}, force=True)
        np.testing.assert_array_equal(manager.restore(1)["w"], np.ones(2))
    assert not (run / "1").is_symlink() and sorted(os.listdir(archive)) == ["checkpoint.json", "w.safetensors"]
    assert sorted(os.listdir(run)) == ["1"]
