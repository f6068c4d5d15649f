"""A step's folder of a checkpoint folder in a bucket, given where ``jaxstow ls`` and ``verify`` want the checkpoint
folder, is named as a step, as a local one is, with the folder to give instead."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow.cli import main


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_a_step_of_a_run_in_a_bucket_is_named_as_a_step_with_its_run(s3_server, capsys, command):
    run = s3_server.url(f"step-at-url-{uuid.uuid4().hex[:8]}", "run")
    with CheckpointManager(run, storage_options=s3_server.storage_options) as manager:
        manager.save(7, {"w": np.arange(3.0)})
    options = ["--storage-options", json.dumps(s3_server.storage_options)]
    assert main([command, f"{run}/7", *options]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"jaxstow {command}: {run}/7: is a folder, step 7 of the checkpoint folder {run}: give that folder, or one of "
        "the step's files\n"
    )
    assert main([command, run, *options]) == 0
