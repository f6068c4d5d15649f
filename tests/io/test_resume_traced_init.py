"""A stopped run continued with ``init_save`` called inside the jitted program (``jax.jit(jax.vmap(...))``), as the
docs allow, with each collector that keeps checkpoints: it keeps the draws the stopped run checkpointed and ends with
as many as the run declared."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler

CHAINS, STEPS, EVERY = 2, 12, 4
INFORMATION = scheduler.static_information(samples_collected=STEPS)


def _collector(kind: str, folder) -> io.DataCollector:
    folder.mkdir(exist_ok=True)
    if kind == "hdf5":
        return io.HDF5Collector(str(folder / "samples.h5"))
    return io.MemoryCollector(save_dir=str(folder / "samples"))


def _run(collector: io.DataCollector, steps: jax.Array) -> list[dict]:
    """Every chain from 1.0 + its index (its samples kept from its checkpoint on), ``init_save`` traced inside the
    program."""
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=EVERY)
    starts = 1.0 + jnp.arange(CHAINS, dtype=jnp.float32)

    def step(carry, t):
        state, x = carry
        x = 0.5 * x + t
        return (save(state, True, {"x": x}, solver_state=x)[0], x), None

    def chain(start):
        state = init_save({"x": 0.0}, 0.0, INFORMATION)
        return jax.lax.scan(step, (state, start), steps)[0][0]

    return postprocess_save(jax.jit(jax.vmap(chain))(starts))


@pytest.mark.parametrize("kind", ["hdf5", "memory"])
def test_a_run_continued_with_init_save_inside_jit_keeps_its_checkpointed_draws(kind, tmp_path):
    # MemoryCollector(save_dir=) raised jax's TracerArrayConversionError: the samples kept with its checkpoints were
    # loaded as values of the traced program.
    whole = _run(_collector(kind, tmp_path / "whole"), jnp.arange(STEPS, dtype=jnp.float32))
    stopped = _collector(kind, tmp_path / "stopped")
    init_save, save, _ = io.save(stopped, checkpoint_every=EVERY)

    def step(carry, t):
        state, x = carry
        x = 0.5 * x + t
        return (save(state, True, {"x": x}, solver_state=x)[0], x), None

    def first_six(index):  # stopped after its checkpoint at step 4, before its end
        state = init_save({"x": 0.0}, 0.0, INFORMATION)
        return jax.lax.scan(step, (state, 1.0 + index), jnp.arange(6, dtype=jnp.float32))[0][0]

    jax.block_until_ready(jax.jit(jax.vmap(first_six))(jnp.arange(CHAINS, dtype=jnp.float32)))
    stopped.close()
    resumed = _run(_collector(kind, tmp_path / "stopped"), jnp.arange(EVERY, STEPS, dtype=jnp.float32))
    for chain in range(CHAINS):
        assert int(resumed[chain]["sample_count"]) == STEPS
        np.testing.assert_array_equal(resumed[chain]["samples"]["x"][:EVERY], whole[chain]["samples"]["x"][:EVERY])
