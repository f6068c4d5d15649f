"""``HDF5Collector.close()`` waits for the blocks still on their way from ``io.save`` before it closes the file."""

from __future__ import annotations

import sys
import textwrap

import forked

_PROGRAM = """
import os, tempfile, jax.numpy as jnp, numpy as np
from jaxstow import io

def run(path, steps):
    collector = io.HDF5Collector(path)
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=4)
    state = init_save({"w": jnp.zeros(2)}, 0.0, io.scheduler.static_information(samples_collected=10))
    for step in range(int(state.step), steps):  # outside jit each sample is a block, handed over on another thread
        state, _ = save(state, True, {"w": jnp.full(2, step, jnp.float32)}, solver_state=float(step))
    return collector, state, postprocess_save

for _ in range(12):
    path = os.path.join(tempfile.mkdtemp(), "samples.h5")
    collector, state, postprocess_save = run(path, 6)
    collector.close()  # the run stops here, blocks still on their way
    collector, state, postprocess_save = run(path, 10)
    np.testing.assert_array_equal(postprocess_save(state, None)["samples"]["w"][:, 0], np.arange(10.0))
"""


def test_close_waits_for_the_blocks_on_their_way_and_the_exit_reports_nothing() -> None:
    ran = forked.run([sys.executable, "-c", textwrap.dedent(_PROGRAM)], capture_output=True, text=True, timeout=200)
    assert ran.returncode == 0, ran.stderr
    assert "failed" not in ran.stderr, ran.stderr
