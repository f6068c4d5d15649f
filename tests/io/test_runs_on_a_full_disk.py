"""``io.run_chains`` writing its file where writes fail (a full disk): the error names the file and the cause, and the
same call, run again once space is freed, continues the run from its last checkpoint, or says that the file was cut
short, leaving it as it is.

The full disk is a real small tmpfs (skipped where mounting one is refused); the other failing writes are real ones
too, past the file size limit (``RLIMIT_FSIZE``) of a process of its own.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import forked

_RUN = """
import resource, signal, sys, jax.numpy as jnp, numpy as np
from jaxstow import io
if len(sys.argv) > 2:  # the most bytes a file may take
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, the process goes on
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
def step(state, t):
    return {"x": state["x"] + 1}, {"x": state["x"]}, jnp.ones(2, bool)
try:
    draws = io.run_chains(sys.argv[1], lambda: {"x": jnp.zeros((2, 64))}, step, num_steps=1500, checkpoint_every=50)
except Exception as error:
    print(type(error).__name__, error)
else:
    print("every draw", np.array_equal(draws["x"][:, :, 0], np.tile(np.arange(1500, dtype=np.float32), (2, 1))))
"""


def _run(path: str, *limit: int) -> str:
    """The run, in a process of its own (as a script run again is), its files at most ``limit`` bytes: what it
    printed."""
    done = forked.run(
        [sys.executable, "-c", textwrap.dedent(_RUN), path, *map(str, limit)], capture_output=True, text=True
    )
    return done.stdout.strip() or done.stderr


def test_a_run_that_fills_the_disk_continues_from_its_last_checkpoint_once_space_is_freed(tmp_path):
    from tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "small", "4m") as disk:
        path, filler = str(disk / "walk.h5"), disk / "filler"
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        filler.write_bytes(bytes(free - 1_000_000))  # room for about half of the run's file
        failed = _run(path)
        assert failed.startswith("CollectorStorageError the queued write of samples "), failed  # which, and where
        assert f" to {path} failed: {path}: cannot write it: no space left on the device holding " in failed, failed
        filler.unlink()
        assert _run(path) == "every draw True"  # it used to refuse the file, "open for writing by a writer ..."


def test_a_run_whose_file_a_failed_write_cut_short_is_refused_naming_the_file_and_left_as_it_is(tmp_path):
    path = str(tmp_path / "walk.h5")
    assert _run(path, 30_000).startswith(f"StorageError {path}: cannot write it: file too large")
    cut = Path(path).read_bytes()
    refused = _run(path)
    assert refused.startswith(f"CollectorError {path} cannot be read as an HDF5 file (truncated file: "), refused
    assert refused.endswith("move it away to start the run over, or write the run to another file")
    assert Path(path).read_bytes()[64:] == cut[64:]  # past the superblock, whose flags the second run cleared


_SET_UP_PAST_THE_LIMIT = """
import resource, signal, sys, jax.numpy as jnp
from jaxstow import io
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of ending the process
resource.setrlimit(resource.RLIMIT_FSIZE, (4000, resource.RLIM_INFINITY))
def step(state, t):
    return {"x": state["x"] + 1}, {"x": state["x"]}, jnp.ones(2, bool)
try:
    io.run_chains(sys.argv[1], lambda: {"x": jnp.zeros((2, 256))}, step, num_steps=400, checkpoint_every=10)
except Exception as error:
    print(type(error).__name__, error)
"""


def test_a_run_whose_file_cannot_be_set_up_raises_the_storage_error_not_hdf5_s_failing_close(tmp_path):
    path = tmp_path / "walk.h5"
    done = forked.run(
        [sys.executable, "-c", textwrap.dedent(_SET_UP_PAST_THE_LIMIT), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.startswith(f"StorageError {path}: cannot write it: file too large"), done.stdout + done.stderr
