"""An empty string as a manager's directory (a setting left unset: ``os.environ.get("CKPT_DIR", "")``) is refused,
rather than taken for the working directory, whose files the steps would then be saved among."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jaxstow import CheckpointManager
from jaxstow.errors import ArgumentError


def test_an_empty_directory_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentError, match=r"not an empty string: give the folder of the run, .*'\.' for the working"):
        CheckpointManager("")
    assert os.listdir(tmp_path) == []
    with CheckpointManager(".") as manager:  # the working directory, said so
        manager.save(1, {"w": np.ones(2)})
    assert CheckpointManager(tmp_path).steps() == [1]
