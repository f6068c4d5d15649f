"""A save onto a file system with free space but no free inodes (a small tmpfs mounted with ``nr_inodes``,
``tests/support/tmpfs.py``): the error says the file system has run out of files, not of space, and what to do; the
steps saved before stay whole."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from tmpfs import leftovers, small_tmpfs

import jaxstow
from jaxstow import CheckpointManager
from jaxstow.errors import StorageError


def _fill_inodes(folder: os.PathLike[str]) -> None:
    """Empty files in ``folder`` until the file system holding it makes no more."""
    for number in range(10_000):
        try:
            open(os.path.join(folder, f"f{number}"), "x").close()
        except OSError as error:
            assert error.errno == errno.ENOSPC
            return
    raise AssertionError("the file system never ran out of inodes")


def test_a_save_onto_a_file_system_out_of_inodes_says_so_and_keeps_the_steps_saved_before(tmp_path):
    with small_tmpfs(tmp_path / "small", "64m", inodes=200) as disk:
        with CheckpointManager(disk / "run") as manager:
            manager.save(1, {"w": np.arange(10.0)})
            manager.wait()
            (disk / "filler").mkdir()
            _fill_inodes(disk / "filler")
            assert os.statvfs(disk).f_bavail > 0  # space left: only the inodes ran out
            manager.save(2, {"w": np.arange(20.0)})
            with pytest.raises(StorageError) as caught:
                manager.wait()
            message = str(caught.value)
            assert f"the file system holding {disk / 'run'} has no free inodes (files) left" in message
            assert "free blocks" in message and "no space left" not in message
            assert "delete files there" in message and "keep_last" in message
            assert caught.value.errno == errno.ENOSPC
        np.testing.assert_array_equal(CheckpointManager(disk / "run").restore(1, as_numpy=True)["w"], np.arange(10.0))
        assert CheckpointManager(disk / "run").steps() == [1] and leftovers(disk / "run") == []


def test_a_file_saved_onto_a_file_system_out_of_inodes_says_so(tmp_path):
    with small_tmpfs(tmp_path / "small", "64m", inodes=50) as disk:
        jaxstow.save(disk / "model.jxs", {"w": np.arange(10.0)})
        _fill_inodes(disk)
        with pytest.raises(
            StorageError, match=f"{disk}/other.jxs: cannot write it: the file system holding {disk} has"
        ):
            jaxstow.save(disk / "other.jxs", {"w": np.arange(10.0)})
        np.testing.assert_array_equal(jaxstow.load(disk / "model.jxs", as_numpy=True)["w"], np.arange(10.0))
