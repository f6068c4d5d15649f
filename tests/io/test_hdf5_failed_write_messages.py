"""An ``HDF5Collector``'s write that fails on its writer thread (a real full disk: a small tmpfs, skipped where mounting
one is refused) is raised by the collector's next call, which does something else: the error names the rows and chain
(or the checkpoint) that were not written and the file, keeps the failure as its cause, and says how to resume, which
then works."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io
from jaxstow.errors import CollectorStorageError, StorageError
from jaxstow.io.live import read_draws

STEPS = 60


def _run(file: Any) -> dict[str, Any]:
    """Samples of 16 KiB a step, in blocks of 8, checkpointed every 10 steps, into ``file`` (a path, or an open
    ``h5py.File``): the run's samples."""
    init_save, save, postprocess_save = io.save(io.HDF5Collector(file), checkpoint_every=10, block_size=8)
    state = init_save({"w": jnp.zeros(4096)}, 0.0, io.scheduler.static_information(samples_collected=STEPS))

    def step(state: Any, t: jax.Array) -> tuple[Any, None]:
        return save(state, True, {"w": jnp.full(4096, t, jnp.float32)}, solver_state=t)[0], None

    state = jax.jit(lambda state, steps: jax.lax.scan(step, state, steps)[0])(
        state, jnp.arange(state.step, STEPS, dtype=jnp.float32)
    )
    return postprocess_save(state, None)["samples"]


def test_a_failed_write_names_the_rows_it_held_and_how_to_resume_and_the_run_resumes(tmp_path):
    from tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "small", "4m") as disk:
        path, filler = str(disk / "walk.h5"), disk / "filler"
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        filler.write_bytes(bytes(free - 500_000))  # room for about 25 of the 60 samples
        with pytest.raises(CollectorStorageError) as failure:
            _run(path)
        message = str(failure.value)
        named = re.fullmatch(
            r"HDF5Collector failed while (.+?): the queued write of samples (\d+)\.\.(\d+) of chain 0 to (.+?) failed: "
            r"(.+?): cannot write it: no space left on the device holding (.+?); free some space there, or write "
            r"elsewhere; once that is fixed, run it again: it continues from the last checkpoint, in (.+?) \(or says "
            r"that the failed write left the file cut short\)",
            message,
        )
        assert named is not None, message  # it named only the call that raised it
        assert named.group(4, 5, 6, 7) == (path, path, str(disk), f"{path}.checkpoint.jxs")
        first, last = int(named[2]), int(named[3])
        assert f"samples {first}..{last}" not in named[1]  # the call that raised it was another one
        error = failure.value
        assert isinstance(error.__cause__, CollectorStorageError)
        assert isinstance(error.__cause__.__cause__, StorageError)
        assert isinstance(error.__cause__.__cause__.__cause__, OSError)
        assert error.errno == errno.ENOSPC and error.filename == path
        io.hdf5_writers.close_writer(path)  # the failed run's collector, which its traceback holds
        filler.unlink()
        written = read_draws(path).done[0]
        assert written <= first  # the rows named are not in the file
        samples = _run(path)  # the same code run again, as the message says
        assert np.array_equal(samples["w"][:, 0], np.arange(STEPS, dtype=np.float32))


def test_a_failed_checkpoint_names_the_checkpoint_and_its_file(tmp_path):
    from tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "small", "1m") as disk:
        (disk / "filler").write_bytes(bytes(os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - 4096))
        path, checkpoint = str(tmp_path / "walk.h5"), str(disk / "walk.h5.checkpoint.jxs")
        collector = io.HDF5Collector(path, checkpoint_dir=disk)
        init_save, save, postprocess_save = io.save(collector, checkpoint_every=2, block_size=2)
        state = init_save({"w": jnp.zeros(4096)}, 0.0, io.scheduler.static_information(samples_collected=6))
        with pytest.raises(CollectorStorageError) as failure:
            for step in range(6):
                state, _ = save(state, True, {"w": jnp.full(4096, step, jnp.float32)}, solver_state=float(step))
            postprocess_save(state, None)
        expected = (
            f": the queued write of the checkpoint of chain 0 at step 2 to {checkpoint} (after the samples before it, "
            f"to {path}) failed: {checkpoint}: cannot write it: no space left on the device holding {disk}; free some "
            "space there, or write elsewhere; the run has no checkpoint to continue from: run it again to start it over"
        )
        assert expected in str(failure.value), str(failure.value)
        assert failure.value.errno == errno.ENOSPC
        collector.close()


#: The run of ``_run`` into an ``h5py.File`` the program opened, on a full disk; the file closed as the program ends.
_FILLED = """
import os, sys, h5py
sys.path.insert(0, sys.argv[2])
from test_hdf5_failed_write_messages import _run
file = h5py.File(sys.argv[1], "w", libver="latest")
try:
    _run(file)
except Exception as error:
    print(error, flush=True)
try:
    file.close()
except RuntimeError:  # HDF5 fails to flush the file as it closes it: its writer flags stay set
    pass
os._exit(0)  # HDF5 may crash at the interpreter's exit after a flush that failed
"""


@contextlib.contextmanager
def _on_a_full_disk(tmp_path: Path, program: str) -> Iterator[tuple[str, Path, subprocess.CompletedProcess[str]]]:
    """``program`` run in a process of its own with a file's path on a full disk (room for about 25 of the 60
    samples) and this folder as its arguments: the path, the file that fills the disk, and what it printed."""
    import forked  # here: the program imports this module, where tests/support is not on the path
    from tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "small", "4m") as disk:
        path, filler = str(disk / "walk.h5"), disk / "filler"
        filler.write_bytes(bytes(os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - 500_000))
        command = [sys.executable, "-c", textwrap.dedent(program), path, os.path.dirname(__file__)]
        yield path, filler, forked.run(command, capture_output=True, text=True)


def test_a_failed_write_into_the_callers_file_says_how_to_resume_it_and_it_resumes(tmp_path):
    with _on_a_full_disk(tmp_path, _FILLED) as (path, filler, done):
        printed = done.stdout.strip() + done.stderr[-2000:]
        assert printed.startswith("HDF5Collector failed while "), printed
        assert printed.endswith(
            f"; once that is fixed, close {path}, clear the writer flags its failed close may leave "
            f"(jaxstow.io.swmr.clear_stale_writer({path!r})), open it with mode 'a' and run it again: it continues "
            f"from the last checkpoint, in {path}.checkpoint.jxs (or says that the failed write left the file cut "
            "short)"
        ), printed
        filler.unlink()
        io.swmr.clear_stale_writer(path)  # as the error says
        with h5py.File(path, "a", libver="latest") as file:
            assert np.array_equal(_run(file)["w"][:, 0], np.arange(STEPS, dtype=np.float32))


#: The run of ``_run`` into a path, on a full disk, the program then ending as any does.
_FILLED_PATH = """
import sys
sys.path.insert(0, sys.argv[2])
from test_hdf5_failed_write_messages import _run
try:
    _run(sys.argv[1])
except Exception as error:
    print(type(error).__name__, flush=True)
"""


def test_a_process_whose_collector_of_a_path_failed_on_a_full_disk_ends_normally(tmp_path):
    # A file the caller opened, whose close then fails, makes HDF5 crash at the interpreter's exit (h5py#914).
    with _on_a_full_disk(tmp_path, _FILLED_PATH) as (_, _, done):
        assert (done.returncode, done.stdout) == (0, "CollectorStorageError\n"), done.stderr[-3000:]
