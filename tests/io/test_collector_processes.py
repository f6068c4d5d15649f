"""A process that a collector starts while it takes a run's samples is the program's: a SIGTERM stops it. The thread
that delivers the samples runs the program's code, so it blocks no signal that a child would inherit."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class Launching(io.MemoryCollector):
    """Starts a process (an upload tool, say) with the first samples it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[subprocess.Popen[bytes]] = []

    def save(self, chain_id, first, values):
        if not self.started:
            self.started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        super().save(chain_id, first, values)


def test_a_process_a_collector_starts_blocks_no_signal_and_stops_on_sigterm():
    collector = Launching()
    init_save, save, postprocess_save = io.save(collector)
    state = init_save({"x": jnp.zeros(3)}, {}, scheduler.static_information(samples_collected=8))
    state = jax.lax.fori_loop(0, 8, lambda i, s: save(s, True, {"x": jnp.full(3, i, jnp.float32)})[0], state)
    draws = postprocess_save(state, None)
    np.testing.assert_array_equal(np.asarray(draws["samples"]["x"])[:, 0], np.arange(8))
    child = collector.started[0]
    try:
        with open(f"/proc/{child.pid}/status") as status:
            blocked = next(line for line in status if line.startswith("SigBlk:")).split()[1]
        child.terminate()
        assert child.wait(timeout=60) == -15
    finally:
        child.kill()
        child.wait()
    assert int(blocked, 16) == 0, f"the child was born blocking signals {blocked}"
