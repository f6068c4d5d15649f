"""``jaxstow verify`` and ``jaxstow ls`` of a run that another process saves with ``keep_last=1``: a step its keep
policy deletes while the command lists the folder is left out, never called damaged, never a bare errno. The other
process saves at a chosen point, as the command lists the folder of a step, not at a moment left to chance."""

from __future__ import annotations

import os
import sys

import forked
import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow.cli import main

WRITER = """
import sys, numpy as np
from jaxstow import CheckpointManager, KeepPolicy
with CheckpointManager(sys.argv[1], keep=KeepPolicy(keep_last=1)) as manager:
    manager.save(3, {"params": {"w": np.full(3, 3, np.float32)}})
"""


@pytest.mark.parametrize("command", ["verify", "ls"])
def test_a_step_deleted_while_the_folder_is_listed_is_left_out(tmp_path, monkeypatch, capsys, command):
    run = tmp_path / "run"
    with CheckpointManager(run) as manager:
        for step in (1, 2):
            manager.save(step, {"params": {"w": np.full(3, step, np.float32)}})
    listdir = os.listdir

    def listed_while_the_run_saves(path: str | os.PathLike[str] = ".") -> list[str]:
        if os.fspath(path) == str(run / "1") and not (run / "3").exists():  # the other process saves step 3 now
            done = forked.run([sys.executable, "-c", WRITER, str(run)], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        return listdir(path)

    monkeypatch.setattr(os, "listdir", listed_while_the_run_saves)
    status = main([command, str(run)])
    out, err = capsys.readouterr()
    assert (run / "3").exists() and not (run / "1").exists()  # the keep policy deleted steps while they were listed
    assert (status, err) == (0, ""), out + err  # was "[Errno 2] No such file or directory: '.../run/1'", status 2
    assert "DAMAGED" not in out and f"{run / '1'}" not in out
