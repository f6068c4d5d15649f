"""A whole orbax run converted to a new folder whose parent cannot be fsynced after the rename that shows it (a
failing device's I/O error, ``tests/support/failing_fsync.py``): the command fails naming the folder and leaves none,
and the same command succeeds once the device does. In this process (``jaxstow.cli.main``): the patch is this
process's."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from failing_fsync import failing_fsync

from jaxstow import CheckpointManager
from jaxstow.cli import main


def test_a_converted_run_whose_folder_cannot_be_synced_is_left_out_and_converts_again(tmp_path, monkeypatch, capsys):
    ocp = pytest.importorskip("orbax.checkpoint")
    with warnings.catch_warnings(), ocp.CheckpointManager(tmp_path / "orbax") as manager:
        warnings.simplefilter("ignore")
        for step in (1, 2):
            manager.save(step, args=ocp.args.StandardSave({"w": np.full(3, step, np.float32)}))
        manager.wait_until_finished()
    out = tmp_path / "out" / "run"
    out.parent.mkdir()
    fail = failing_fsync(monkeypatch)
    fail(out.parent)
    assert main(["convert", str(tmp_path / "orbax"), str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"jaxstow convert: {out}: cannot make the folder: I/O error")
    assert os.listdir(out.parent) == []  # was: the run left in place, and converting again refused
    fail(None)
    assert main(["convert", str(tmp_path / "orbax"), str(out)]) == 0
    assert CheckpointManager(out).steps() == [1, 2]
