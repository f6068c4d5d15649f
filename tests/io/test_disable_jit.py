"""A run whose whole program, ``init_save`` included, runs under ``jax.disable_jit()``, as a debugging session runs
it: the same samples and checkpoints as compiled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.io.chains import read_checkpoint

INFORMATION = scheduler.static_information(samples_collected=6)


@pytest.mark.parametrize("checkpoint_every", [0, 4])
def test_a_chain_run_without_jit_from_init_save_on(checkpoint_every, tmp_path):
    init_save, save, postprocess_save = io.save(
        io.MemoryCollector(save_dir=tmp_path), checkpoint_every=checkpoint_every, block_size=2
    )
    with jax.disable_jit():
        state = init_save({"x": jnp.zeros(())}, jnp.zeros(()), INFORMATION)

        def step(state, i):
            x = i.astype(jnp.float32)
            return save(state, True, {"x": x}, solver_state=x)[0], None

        state, _ = jax.lax.scan(step, state, jnp.arange(5))
        if checkpoint_every:
            record, samples = read_checkpoint(str(tmp_path / "chain_0.checkpoint.jxs"))
            assert record["step"] == 4 and record["sample_count"] == 4
            np.testing.assert_array_equal(samples["x"], np.arange(4, dtype=np.float32))
        result = postprocess_save(state, None)
    assert int(result["sample_count"]) == 5
    np.testing.assert_array_equal(result["samples"]["x"], np.arange(5, dtype=np.float32))


def test_vmapped_chains_run_without_jit_from_init_save_on():
    init_save, save, postprocess_save = io.save(io.MemoryCollector(), block_size=2)
    with jax.disable_jit():
        states = jax.vmap(lambda _: init_save({"x": jnp.zeros(())}, None, INFORMATION))(jnp.arange(2))

        def chain(state, offset):
            step = lambda state, i: (save(state, True, {"x": i + offset})[0], None)  # noqa: E731
            return jax.lax.scan(step, state, jnp.arange(5.0))[0]

        results = postprocess_save(jax.vmap(chain)(states, jnp.array([0.0, 10.0])), None)
    for result, offset in zip(results, [0.0, 10.0], strict=True):
        np.testing.assert_array_equal(result["samples"]["x"], offset + np.arange(5, dtype=np.float32))
