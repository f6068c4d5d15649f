"""``HDF5Collector.close()`` waits for the blocks still on their way from ``io.save`` before it closes the file."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import forked
import jax
import jax.numpy as jnp
import pytest

from jaxstow import io
from jaxstow.errors import CheckpointError, CollectorError

_PROGRAM = """
import os, tempfile, time, jax.numpy as jnp, numpy as np
from jaxstow import io

class Slow(io.HDF5Collector):  # saves its own way: its blocks are queued, and delivered on another thread
    def save_chains(self, blocks):
        time.sleep(0.01)  # each block still on its way when close() is called
        super().save_chains(blocks)

def run(path, steps):
    collector = Slow(path)
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=4)
    state = init_save({"w": jnp.zeros(2)}, 0.0, io.scheduler.static_information(samples_collected=10))
    for step in range(int(state.step), steps):  # outside jit each sample is a block, handed over on another thread
        state, _ = save(state, True, {"w": jnp.full(2, step, jnp.float32)}, solver_state=float(step))
    return collector, state, postprocess_save

for _ in range(2):  # each one fails without the wait: its blocks are delivered 10 ms apart
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


def test_a_new_collector_of_a_file_whose_run_failed_in_this_process_says_to_close_the_first(tmp_path: Path) -> None:
    path = str(tmp_path / "samples.h5")

    def run(collector: io.HDF5Collector, fail: bool) -> dict:
        init_save, save, postprocess_save = io.save(collector)
        state = init_save({"x": jnp.zeros(3)}, None, io.scheduler.static_information(samples_collected=10))
        state, _ = jax.lax.scan(lambda s, i: (save(s, True, {"x": jnp.ones(3) * i})[0], None), state, jnp.arange(10.0))
        if fail:
            raise RuntimeError("the user's code after the scan failed")
        return postprocess_save(state, None)

    first = io.HDF5Collector(path)
    with pytest.raises(RuntimeError):
        run(first, fail=True)
    with pytest.raises(CheckpointError, match=r"this one\).*whose run did not reach postprocess_save.*close\(\) first"):
        run(io.HDF5Collector(path), fail=False)
    first.close()
    assert run(io.HDF5Collector(path), fail=False)["samples"]["x"][:, 0].tolist() == list(range(10))


def test_a_file_kept_open_by_the_chains_of_a_failed_run_says_to_close_the_collector(tmp_path: Path) -> None:
    path = str(tmp_path / "samples.h5")
    collector = io.HDF5Collector(path)
    init_save, save, postprocess_save = io.save(collector)

    def run(fail: bool) -> dict:
        state = init_save({"x": jnp.zeros(3)}, None, io.scheduler.static_information(samples_collected=4))
        state, _ = jax.lax.scan(lambda s, i: (save(s, True, {"x": jnp.ones(3) * i})[0], None), state, jnp.arange(4.0))
        if fail:
            raise RuntimeError("the user's code after the scan failed")
        return postprocess_save(state, None)

    with pytest.raises(RuntimeError):
        run(fail=True)
    assert run(fail=False)["samples"]["x"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]  # the strategy used again
    with pytest.raises(CollectorError, match=r"a collector with chains of a run that failed keeps it open until its"):
        io.live.read_draws(path)
    collector.close()
    assert io.live.read_draws(path).chains[1]["x"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
