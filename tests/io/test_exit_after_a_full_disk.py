"""A script whose sampling run failed on a full disk, and that caught the ``StorageError``, ends as any script does:
exit status 0 (it used to crash as it ended, a segmentation fault in HDF5, which freed the datasets whose close
failed but kept their identifiers), its file then continued, or refused by name, by the same script run again.

The full disk is a real small tmpfs (skipped where mounting one is refused); a write failing past the file size limit
(``RLIMIT_FSIZE``) stands for a write error other than no space.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import forked
import pytest

_SET_UP = """
import resource, signal, sys, jax.numpy as jnp
from jaxstow import io
if len(sys.argv) > 3:  # the most bytes a file may take
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, the process goes on
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))
"""

#: io.run_chains's run, of 32 KiB of draws a step.
_RUN_CHAINS = """
def step(state, t):
    return {"x": state["x"] + 1}, {"x": state["x"]}, jnp.ones(2, bool)
try:
    draws = io.run_chains(sys.argv[1], lambda: {"x": jnp.zeros((2, 4096))}, step, num_steps=60, checkpoint_every=10)
except Exception as error:
    print(type(error).__name__, error)
else:
    print("every draw", draws["x"].shape)
"""

#: An HDF5Collector's run through io.save, of 16 KiB of samples a step, closed by the script once it failed.
_COLLECTOR = """
try:
    collector = io.HDF5Collector(sys.argv[1])  # refuses a file that a failed run cut short
except Exception as error:
    print(type(error).__name__, error)
    sys.exit()
init_save, save, postprocess_save = io.save(collector, checkpoint_every=2)
try:
    state = init_save({"w": jnp.zeros(4096)}, 0.0, io.scheduler.static_information(samples_collected=60))
    for step in range(int(state.step), 60):
        state, _ = save(state, True, {"w": jnp.full(4096, step, jnp.float32)}, solver_state=float(step))
    print("every draw", postprocess_save(state, None)["samples"]["w"].shape)
except Exception as error:
    print(type(error).__name__, error)
    try:
        collector.close()
    except Exception as error:
        print("close:", type(error).__name__, error)
"""


def _run(program: str, path: Path, *limit: int) -> tuple[int, str]:
    """``program`` run on ``path`` in a process of its own, its files at most ``limit`` bytes: its exit status and
    what it printed."""
    code = textwrap.dedent(_SET_UP) + textwrap.dedent(program)
    done = forked.run([sys.executable, "-c", code, str(path), "run", *map(str, limit)], capture_output=True, text=True)
    return done.returncode, done.stdout.strip() + done.stderr[-2000:]


@pytest.mark.parametrize(("program", "shape"), [(_RUN_CHAINS, "(2, 60, 4096)"), (_COLLECTOR, "(60, 4096)")])
def test_a_script_that_caught_a_full_disk_s_error_exits_with_status_0_and_its_run_continues(tmp_path, program, shape):
    from tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "small", "4m") as disk:
        path, filler = disk / "walk.h5", disk / "filler"
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        filler.write_bytes(bytes(free - 500_000))  # room for a part of the run's file
        status, printed = _run(program, path)
        assert printed.startswith("CollectorStorageError"), printed
        assert f"{path}: cannot write it: no space left on the device holding {disk}" in printed
        assert status == 0, printed  # it was -11: HDF5 crashed as the process ended
        filler.unlink()
        assert _run(program, path) == (0, f"every draw {shape}")


@pytest.mark.parametrize("program", [_RUN_CHAINS, _COLLECTOR])
def test_a_script_that_caught_a_write_error_past_the_file_size_limit_exits_with_status_0(tmp_path, program):
    path = tmp_path / "walk.h5"
    status, printed = _run(program, path, 300_000)
    assert f"{path}: cannot write it: file too large for its file system" in printed, printed
    assert status == 0, printed  # it was -11
    status, printed = _run(program, path)  # continued, started over, or the file refused by name as cut short
    assert status == 0, printed
    assert printed.startswith(("every draw", f"CollectorError {path} cannot be read as an HDF5 file")), printed
