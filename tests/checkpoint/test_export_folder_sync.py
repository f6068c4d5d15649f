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


def test_the_staging_folder_of_an_export_killed_midway_is_removed_by_the_next_export(tmp_path):
    import signal
    import subprocess
    import sys

    source, out = tmp_path / "model.jxs", tmp_path / "hf"
    jaxstow.save(source, {f"layer{i}": {"kernel": np.full((256, 256), i, np.float32)} for i in range(12)})
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, signal, sys, jaxstow.checkpoint.hf_export as export\n"
            "written = export._write_shard\n"
            "def write_then_die(*args):\n"
            "    written(*args)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)  # killed after its first shard\n"
            "export._write_shard = write_then_die\n"
            "export.export_safetensors(sys.argv[1], sys.argv[2], max_shard_size='300KB')\n",
            str(source),
            str(out),
        ]
    )
    assert killed.wait(timeout=120) == -signal.SIGKILL
    (left,) = [name for name in os.listdir(tmp_path) if name.startswith(".hf")]  # its shards, hidden
    assert not out.exists() and os.listdir(tmp_path / left)
    jaxstow.export_safetensors(source, out, max_shard_size="300KB")
    assert sorted(os.listdir(tmp_path)) == ["hf", "model.jxs"]  # was: the dead export's shards kept for ever
    np.testing.assert_array_equal(jaxstow.load(out, as_numpy=True)["layer11.kernel"], np.full((256, 256), 11))
