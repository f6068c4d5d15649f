"""Saving from inside jit with ``jax_enable_x64`` on: 64-bit samples kept exactly, with both collectors, checkpoints
and chains under ``vmap`` (a process of its own, as the flag is the whole process's)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import forked

_PROGRAM = """
import sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np
from jaxstow import io

def run(collector, chains, **options):
    init_save, save, postprocess_save = io.save(collector, **options)
    sample = {"x": jnp.zeros(2, jnp.float64), "n": jnp.zeros((), jnp.uint64)}
    information = io.scheduler.static_information(samples_collected=7)
    init = lambda _: init_save(sample, 0.0, information)
    state = jax.vmap(init)(jnp.arange(chains))

    def step(state, i):
        value = {"x": jnp.full(2, i / 4, jnp.float64), "n": jnp.uint64(2**63 + 5) + i.astype(jnp.uint64)}
        return jax.vmap(lambda s: save(s, True, value, solver_state=i / 3)[0])(state), None

    state, _ = jax.jit(lambda s: jax.lax.scan(step, s, jnp.arange(7)))(state)
    return postprocess_save(state, None)

for collector in (io.MemoryCollector(save_dir=sys.argv[1] + "-memory"), io.HDF5Collector(sys.argv[1])):
    for result in run(collector, 2, checkpoint_every=3):
        assert int(result["sample_count"]) == 7
        np.testing.assert_array_equal(result["samples"]["x"][:, 0], np.arange(7) / 4)
        assert result["samples"]["n"].dtype == np.uint64
        assert [int(n) for n in result["samples"]["n"]] == [2**63 + 5 + i for i in range(7)]
print("ok")
"""


def test_saving_with_x64_on_keeps_64_bit_samples_exactly(tmp_path: Path) -> None:
    program = textwrap.dedent(_PROGRAM)
    ran = forked.run([sys.executable, "-c", program, str(tmp_path / "samples.h5")], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stderr[-3000:]
