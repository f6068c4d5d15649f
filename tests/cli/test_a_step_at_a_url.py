"""A step's folder of a checkpoint folder in a bucket, given where ``jaxstow ls`` and ``verify`` want the checkpoint
folder, is named as a step, as a local one is, by its URL and its checkpoint folder's, with what to give instead."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow.cli import main


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_a_step_of_a_run_in_a_bucket_is_named_as_a_step_by_its_url(s3_server, capsys, command):
    run = s3_server.url(f"step-at-url-{uuid.uuid4().hex[:8]}", "run")
    with CheckpointManager(run, storage_options=s3_server.storage_options) as manager:
        manager.save(7, {"params": {"w": np.arange(3.0)}})
    options = ["--storage-options", json.dumps(s3_server.storage_options)]
    for given in (f"{run}/7", f"{run}/7/"):
        assert main([command, given, *options]) == 2
        assert capsys.readouterr().err == (
            f"jaxstow {command}: {given}: is a folder, step 7 of the checkpoint folder {run}: give that folder, or one "
            f"of the step's files, e.g. {run}/7/params.safetensors\n"
        )
    assert main([command, run, *options]) == 0
