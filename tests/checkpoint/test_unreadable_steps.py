"""A step folder this user cannot look into (a run copied with ``cp -a`` from a user whose umask was 077) is a step
all the same: restoring it says it cannot be read, never restores the step before it as the latest. So is a step
folder that is a loop of links, which the command line reports as damaged beside the steps it checks. Run in a child
that obeys permission bits (:mod:`tests.support.permissions`), as root ignores them."""

from __future__ import annotations

import shutil
import sys
import textwrap

import numpy as np
import pytest
from forked_cli import jaxstow_command

from jaxstow import CheckpointManager
from jaxstow.errors import StorageError
from tests.support.permissions import run_obeying_permission_bits

_PROGRAM = """
    import sys
    from jaxstow import CheckpointManager
    from jaxstow.errors import StorageError
    manager = CheckpointManager(sys.argv[1])
    print("steps", manager.steps(), "latest", manager.latest_step())
    try:
        print("restored", manager.restore()["w"].tolist())
    except StorageError as error:
        print("refused", error)
"""


@pytest.fixture
def run(tmp_path):
    folder = tmp_path / "run"
    with CheckpointManager(folder) as manager:
        for step in (1, 2, 3):
            manager.save(step, {"w": np.full(2, float(step))})
    yield folder
    for path in folder.iterdir():
        if not path.is_symlink():
            path.chmod(0o755)


def test_the_newest_step_unreadable_is_refused_not_replaced_by_the_one_before(run):
    (run / "3").chmod(0o000)
    finished = run_obeying_permission_bits(sys.executable, "-c", textwrap.dedent(_PROGRAM), str(run))
    lines = finished.stdout.splitlines()
    # was: "steps [1, 2] latest 2" and step 2's values restored as the latest, without a word
    assert lines[0] == "steps [1, 2, 3] latest 3", finished.stderr
    assert lines[1].startswith(f"refused {run / '3' / 'checkpoint.json'}: cannot read it: permission denied")
    assert f"check the permissions of {run / '3'}" in lines[1]


def test_the_command_line_lists_no_step_of_a_folder_with_an_unreadable_step(run):
    (run / "3").chmod(0o000)
    finished = run_obeying_permission_bits(sys.executable, "-m", "jaxstow", "ls", str(run))
    assert finished.returncode == 2 and finished.stdout == ""
    assert finished.stderr.startswith(f"jaxstow ls: {run / '3' / 'checkpoint.json'}: cannot read it: permission")
    assert "Traceback" not in finished.stderr


def test_an_unreadable_folder_that_is_not_a_step_is_left_out(run):
    (run / "lost+found").mkdir(mode=0o700)  # the root of a file system of its own, owned by root
    (run / "lost+found").chmod(0o000)
    finished = run_obeying_permission_bits(sys.executable, "-c", textwrap.dedent(_PROGRAM), str(run))
    assert finished.stdout.splitlines() == ["steps [1, 2, 3] latest 3", "restored [3.0, 3.0]"], finished.stderr


def test_a_step_that_is_a_loop_of_links_is_named_and_the_other_steps_are_listed_and_checked(run, tmp_path):
    shutil.rmtree(run / "1")
    (run / "1").symlink_to("1")  # a loop: following it fails with ELOOP
    manager = CheckpointManager(run)  # was: steps() raised Python's OSError, and ls and verify checked no step
    assert manager.steps() == [1, 2, 3] and manager.restore(as_numpy=True)["w"].tolist() == [3.0, 3.0]
    with pytest.raises(StorageError, match=r"1/checkpoint\.json: cannot read it: too many levels of symbolic links"):
        manager.restore(1)
    listed = jaxstow_command("ls", run)
    assert listed.returncode == 1 and "Traceback" not in listed.stderr
    assert "DAMAGED  step 1: " in listed.stdout and "3 steps (1 damaged)" in listed.stdout, listed.stdout
    verified = jaxstow_command("verify", run)
    assert verified.returncode == 1 and verified.stdout.count("ok ") == 2, verified.stdout
    (tmp_path / "loop.jxs").symlink_to("loop.jxs")
    exported = jaxstow_command("export", tmp_path / "loop.jxs", tmp_path / "out")
    assert exported.returncode == 2 and exported.stderr.strip() == (
        f"jaxstow export: {tmp_path / 'loop.jxs'}: cannot look into it: too many levels of symbolic links"
    )
