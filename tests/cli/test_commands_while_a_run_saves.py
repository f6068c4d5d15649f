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


def _saved_by_the_other_process_first(run, monkeypatch, owner, name):
    """``owner.name`` made to run the other process's save of step 3 (deleting steps 1 and 2) before its first call."""
    original = getattr(owner, name)

    def called_while_the_run_saves(*args, **kwargs):
        if not (run / "3").exists():
            done = forked.run([sys.executable, "-c", WRITER, str(run)], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, called_while_the_run_saves)


def _two_steps(tmp_path):
    run = tmp_path / "run"
    with CheckpointManager(run) as manager:
        for step in (1, 2):
            manager.save(step, {"params": {"w": np.full(3, step, np.float32)}})
    return run


@pytest.mark.parametrize("command", ["verify", "ls"])
def test_every_step_listed_deleted_before_its_record_is_read_has_the_folder_listed_again(
    tmp_path, monkeypatch, capsys, command
):
    from jaxstow.checkpoint.step_folder import StepFolder

    run = _two_steps(tmp_path)
    _saved_by_the_other_process_first(run, monkeypatch, StepFolder, "read_record")
    status = main([command, str(run)])
    out, err = capsys.readouterr()
    assert not (run / "1").exists() and not (run / "2").exists()
    assert (status, err) == (0, ""), out + err  # was "holds no committed checkpoint step", status 2
    assert str(run / "3") in out or "3" in out.split()


def test_every_step_deleted_while_it_is_verified_has_the_steps_then_verified_never_0_files_intact(
    tmp_path, monkeypatch, capsys
):
    import jaxstow.cli.verify as verify

    run = _two_steps(tmp_path)
    _saved_by_the_other_process_first(run, monkeypatch, verify, "verify_step")
    status = main(["verify", str(run)])
    out, err = capsys.readouterr()
    assert (status, err) == (0, ""), out + err
    assert f"ok       {run / '3' / 'params.safetensors'}" in out and out.splitlines()[-1] == "1 file intact", out


@pytest.mark.parametrize("command", ["verify", "ls"])
def test_a_folder_whose_steps_are_deleted_before_each_read_says_so(tmp_path, monkeypatch, capsys, command):
    from jaxstow.checkpoint.step_folder import StepFolder
    from jaxstow.errors import StepNotFoundError

    run = _two_steps(tmp_path)

    def deleted(self, step, **kwargs):
        raise StepNotFoundError(f"step {step} was deleted", file=str(run))

    monkeypatch.setattr(StepFolder, "read_record", deleted)
    status = main([command, str(run)])
    _, err = capsys.readouterr()
    assert status == 2 and "Traceback" not in err
    assert "each step it listed, last 1 to 2, was deleted before its record was read, 10 times" in err
    assert "have the run keep more steps" in err
