"""A step the keep policy deletes whose files this user may not delete (its folder read-only): the save says so, and
the files left under a temporary name never stop a later save; a manager opened once they may be deleted removes
them. Run in a child that obeys permission bits (:mod:`tests.support.permissions`), as root ignores them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

from jaxstow import CheckpointManager, KeepPolicy
from tests.support.permissions import run_obeying_permission_bits

_SAVE = """
    import logging, sys
    import numpy as np
    from jaxstow import CheckpointManager, KeepPolicy
    from jaxstow.errors import CheckpointError
    logging.basicConfig(format="%(levelname)s %(message)s")
    with CheckpointManager(sys.argv[1], keep=KeepPolicy(keep_last=2)) as manager:
        try:
            manager.save(int(sys.argv[2]), {"w": np.full(2, float(sys.argv[2]))})
            manager.wait()
            print("saved")
        except CheckpointError as error:
            print("refused", error)
"""


def _save(run, step: int) -> subprocess.CompletedProcess[str]:
    """Save ``step`` in a child that obeys permission bits."""
    return run_obeying_permission_bits(sys.executable, "-c", textwrap.dedent(_SAVE), str(run), str(step))


def test_a_step_whose_files_cannot_be_deleted_never_stops_a_later_save(tmp_path):
    run = tmp_path / "run"
    with CheckpointManager(run, keep=KeepPolicy(keep_last=2)) as manager:
        manager.save(1, {"w": np.full(2, 1.0)})
        manager.save(2, {"w": np.full(2, 2.0)})
    (run / "1").chmod(0o555)  # its files cannot be deleted
    try:
        third = _save(run, 3)
        assert third.stdout.startswith("refused saving step 3 to"), third.stderr
        assert "step 3 is saved, but deleting step 1, which the keep policy keeps no more, failed" in third.stdout
        assert "(a later save or manager of this folder tries again)" in third.stdout
        assert "its files left under a temporary name): permission denied" in third.stdout
        (leftover,) = [name for name in os.listdir(run) if name.startswith(".1.")]
        fourth = _save(run, 4)
        # was: Python's PermissionError from every later save, the manager unable to take its folder's lock
        assert fourth.stdout == "saved\n", fourth.stdout + fourth.stderr
        assert f"WARNING {run / leftover}: cannot delete this leftover of a save: permission denied" in fourth.stderr
    finally:
        for path in run.iterdir():
            path.chmod(0o755)
    assert CheckpointManager(run).steps() == [3, 4]
    with CheckpointManager(run, keep=KeepPolicy(keep_last=2)) as manager:
        manager.save(5, {"w": np.full(2, 5.0)})
    assert sorted(os.listdir(run)) == ["4", "5"]
