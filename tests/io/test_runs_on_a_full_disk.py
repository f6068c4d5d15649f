"""``io.run_chains`` writing its file where writes fail (a full disk): the error names the file and the cause.

The write that fails before the file is even set up is a real one, past the file size limit (``RLIMIT_FSIZE``) of a
process of its own.
"""

from __future__ import annotations

import sys
import textwrap

import forked

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
