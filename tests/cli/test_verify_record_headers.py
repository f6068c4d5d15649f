"""``jaxstow verify`` and ``jaxstow ls`` of a checkpoint folder read each step as the manager's restore reads it: an
item file that is not the one its step's record names is damage, and a step whose record does not check is reported
as damaged while the other steps are checked and listed. Each command runs in a process of its own
(tests/support/forked_cli.py)."""

from __future__ import annotations

import json
import shutil
import subprocess

import forked_cli
import numpy as np
import pytest

from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.errors import CorruptFileError


def jaxstow_command(*args: object, check: int) -> subprocess.CompletedProcess[str]:
    done = forked_cli.jaxstow_command(*args)
    assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done


def test_verify_names_an_item_file_that_is_not_the_one_its_record_names(tmp_path):
    run = tmp_path / "run"
    with CheckpointManager(run) as manager:
        for step in (1, 2):
            manager.save(step, {"params": {"w": np.full(3, step, np.float32)}, "opt": {"mu": np.zeros(3, np.float32)}})
    shutil.copy(run / "1" / "params.safetensors", run / "2" / "params.safetensors")  # a bad copy: intact, but step 1's
    with pytest.raises(CorruptFileError, match="not the one that was saved"):
        CheckpointManager(run).restore(2)
    done = jaxstow_command("verify", run, check=1)
    damaged = run / "2" / "params.safetensors"
    assert f"DAMAGED  {damaged}: the header of item 'params' of step 2 has checksum " in done.stdout
    assert "the file is not the one that was saved" in done.stdout
    assert f"ok       {run / '2' / 'opt.safetensors'}: 1 checksum" in done.stdout
    assert done.stdout.splitlines()[-1] == "1 of 4 files damaged"
    report = json.loads(jaxstow_command("verify", "--json", run, check=1).stdout)
    assert not report["intact"]
    assert [entry["file"] for entry in report["files"] if entry["damage"]] == [str(damaged)]


@pytest.fixture
def damaged_run(tmp_path):
    """Steps 1 to 4: step 2's item file missing, step 3's record empty, step 4's item file empty."""
    run = tmp_path / "run"
    with CheckpointManager(run, keep=KeepPolicy(keep_last=4, keep_best=1, metric="loss")) as manager:
        for step in (1, 2, 3, 4):
            manager.save(step, {"w": np.full(2, step, np.float32)}, metrics={"loss": 1.0 / step})
    (run / "2" / "w.safetensors").unlink()
    (run / "3" / "checkpoint.json").write_bytes(b"")
    (run / "4" / "w.safetensors").write_bytes(b"")
    return run


def test_verify_reports_a_damaged_record_and_checks_the_other_steps(damaged_run):
    run = damaged_run
    out = jaxstow_command("verify", run, check=1).stdout.splitlines()
    assert out[0] == f"ok       {run / '1' / 'w.safetensors'}: 1 checksum, 8 B read"
    assert out[1] == f"DAMAGED  {run / '2' / 'w.safetensors'}: step 2 lists the item 'w', but its file is missing"
    assert out[2].startswith(f"DAMAGED  {run / '3' / 'checkpoint.json'}: the step record is not valid JSON")
    assert out[3].startswith(f"DAMAGED  {run / '4' / 'w.safetensors'}: ")
    assert out[4] == "3 of 4 files damaged"


def test_ls_lists_every_step_and_names_the_damaged_ones(damaged_run):
    run = damaged_run
    out = jaxstow_command("ls", run, check=1).stdout.splitlines()
    rows = {int(line.split()[0]): line for line in out[1:5]}
    assert sorted(rows) == [1, 2, 3, 4]
    assert "loss=1 " in rows[1] and "DAMAGED" in rows[2] and "DAMAGED" in rows[3] and "loss=0.25" in rows[4]
    assert rows[3].split()[1:3] == ["-", "-"]  # no time, no size: the record cannot be read
    assert (
        out[5] == f"DAMAGED  step 2: {run / '2' / 'w.safetensors'}: step 2 lists the item 'w', but its file is missing"
    )
    assert out[6].startswith(f"DAMAGED  step 3: {run / '3' / 'checkpoint.json'}: the step record is not valid JSON")
    assert out[7].startswith("4 steps (2 damaged), ") and out[7].endswith("keep_last=4, keep_best=1 by loss (min)")
    listing = json.loads(jaxstow_command("ls", "--json", run, check=1).stdout)
    steps = {row["step"]: row for row in listing["steps"]}
    assert steps[1]["damaged"] is None and steps[1]["bytes"] > 0
    assert "its file is missing" in steps[2]["damaged"] and steps[2]["bytes"] is None
    assert "not valid JSON" in steps[3]["damaged"] and steps[3]["time"] is None
    assert steps[4]["kept_by"] == ["last 4", "best 1 by loss"]
