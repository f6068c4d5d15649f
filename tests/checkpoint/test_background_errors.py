"""Errors of background saves reach the caller: at the next save, wait, close or end of a ``with`` block, with cause.

The read-only folder is real: the scenario runs in a subprocess that makes its folder read-only with ``chmod`` while it
saves. Permission bits do not stop root, so when the tests run as root the subprocess first gives up the capabilities
that override them (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``, ``CAP_FOWNER``, dropped from its bounding set with
``prctl(PR_CAPBSET_DROP)`` before ``exec``); it stays the owner of its folder, as an ordinary user would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from jaxstow import CheckpointManager
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow.errors import CheckpointError, UnsaveableObjectError


def _read_only_scenario(folder: str) -> dict:
    """Save, make the folder read-only mid-run, save again; report what the caller saw."""
    root = os.path.join(folder, "run")
    report: dict = {}
    manager = CheckpointManager(root)
    manager.save(1, {"w": jnp.ones(1000)})
    manager.wait()
    os.chmod(root, 0o555)
    manager.save(2, {"w": jnp.full(1000, 2.0)})  # returns at once: the write fails on the background thread
    try:
        manager.wait()
    except CheckpointError as error:
        report["wait_error"], report["wait_cause"] = str(error), type(error.__cause__).__name__
    manager.save(3, {"w": jnp.full(1000, 3.0)})
    try:
        manager.save(4, {"w": jnp.full(1000, 4.0)})
    except CheckpointError as error:
        report["save_error"], report["save_cause"] = str(error), type(error.__cause__).__name__
    report["steps"] = manager.steps()
    report["restored"] = float(manager.restore(as_numpy=True)["w"][0])
    os.chmod(root, 0o755)
    manager.save(4, {"w": jnp.full(1000, 4.0)})
    manager.close()
    report["after"] = CheckpointManager(root).steps()
    report["leftovers"] = [name for name in os.listdir(root) if TEMPORARY_MARKER in name]
    return report


def test_read_only_folder_mid_run(tmp_path):
    from permissions import obey_permission_bits  # here: this file also runs as a script, without tests/support

    folder = str(tmp_path)
    try:
        result = subprocess.run(
            [sys.executable, __file__, folder],
            preexec_fn=obey_permission_bits if os.geteuid() == 0 else None,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.SubprocessError as error:  # raised when preexec_fn fails
        pytest.skip(
            f"running as root without the right to drop CAP_DAC_OVERRIDE (CAP_SETPCAP), so chmod stops nothing: {error}"
        )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    root = os.path.join(folder, "run")
    denied = "cannot write it: permission denied; check the permissions of"
    assert report["wait_error"].startswith(f"saving step 2 to {root} failed in the background: {root}/2: {denied}")
    assert report["wait_cause"] == "StorageError"
    assert report["save_error"].startswith(f"saving step 3 to {root} failed in the background: {root}/3: {denied}")
    assert report["save_cause"] == "StorageError"
    assert report["steps"] == [1] and report["restored"] == 1.0
    assert report["after"] == [1, 4] and report["leftovers"] == []


def test_unsaveable_leaf_surfaces_at_wait(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(0, {"w": jnp.ones(2)})
        manager.save(1, {"w": jnp.ones(2), "act": {"f": lambda x: x}})
        with pytest.raises(CheckpointError, match=r"saving step 1 to .* failed in the background") as caught:
            manager.wait()
        assert isinstance(caught.value.__cause__, UnsaveableObjectError)
        assert "cannot save leaf 'f'" in str(caught.value)
        manager.wait()  # raised once, then cleared
        assert manager.steps() == [0]
        manager.save(1, {"w": jnp.ones(2)})
    assert not [name for name in os.listdir(tmp_path) if TEMPORARY_MARKER in name]


def test_error_surfaces_at_close_and_at_the_end_of_with(tmp_path):
    manager = CheckpointManager(tmp_path / "a")
    manager.save(0, {"f": lambda x: x})
    with pytest.raises(CheckpointError, match="saving step 0") as caught:
        manager.close()
    assert isinstance(caught.value.__cause__, UnsaveableObjectError)
    manager.close()  # closed once and for all
    with pytest.raises(CheckpointError, match="saving step 5") as caught, CheckpointManager(tmp_path / "b") as other:
        other.save(5, {"f": print})
    # The lock was released although the save failed: a new writer can start.
    with CheckpointManager(tmp_path / "b") as again:
        again.save(5, {"w": jnp.ones(1)})


def test_an_error_the_with_block_raises_goes_on_holding_the_failed_save_as_a_note(tmp_path, caplog):
    with pytest.raises(KeyError, match="lr") as caught, CheckpointManager(tmp_path) as manager:
        manager.save(0, {"f": print})
        raise KeyError("lr")
    assert caught.value.__notes__ == [f"closing the checkpoint manager also failed: {_failure_of_step_0(tmp_path)}"]
    assert "saving step 0" in caplog.text  # logged when it came


def _failure_of_step_0(folder) -> str:
    with pytest.raises(CheckpointError) as caught, CheckpointManager(folder) as manager:
        manager.save(0, {"f": print})
    return str(caught.value)


def test_failed_commit_leaves_nothing_behind(tmp_path):
    """The commit's rename fails (a file sits where the step's folder goes): the temporary folder is removed."""
    good = {"w": jnp.ones(3)}
    with CheckpointManager(tmp_path) as manager:
        manager.save(0, good)
        manager.wait()
        (tmp_path / "1").write_text("a file where step 1's folder goes")
        manager.save(1, good)
        with pytest.raises(CheckpointError, match="saving step 1") as caught:
            manager.wait()
        assert isinstance(caught.value.__cause__, OSError)
        assert manager.steps() == [0]
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]  # no temporary folder; the lock went at close


if __name__ == "__main__":
    print(json.dumps(_read_only_scenario(sys.argv[1])))
