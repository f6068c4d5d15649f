"""An export whose files are written whole but whose parent folder cannot be fsynced after the rename that shows
them (a failing device's I/O error, ``tests/support/failing_fsync.py``): the export fails and leaves no folder, as the
error says, and the same export succeeds once the device does."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from failing_fsync import failing_fsync

import jaxstow
from jaxstow.errors import StorageError


def test_an_export_whose_folder_cannot_be_synced_leaves_nothing_and_exports_again(tmp_path, monkeypatch):
    source, out = tmp_path / "model.jxs", tmp_path / "out" / "hf"
    jaxstow.save(source, {"w": np.arange(6.0)})
    out.parent.mkdir()
    fail = failing_fsync(monkeypatch)
    fail(out.parent)
    with pytest.raises(StorageError, match=f"^{out}: cannot write it: I/O error") as caught:
        jaxstow.export_safetensors(source, out)
    assert caught.value.errno == errno.EIO
    assert os.listdir(out.parent) == []  # was: the folder left in place, and the export again "exists already"
    fail(None)
    jaxstow.export_safetensors(source, out)
    np.testing.assert_array_equal(jaxstow.load(out, as_numpy=True)["w"], np.arange(6.0))
