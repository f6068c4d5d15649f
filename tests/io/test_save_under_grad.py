"""A function that calls ``save`` differentiated with ``jax.grad``: what is saved is a value that no gradient flows
through, so the gradient is that of the function without the call, and the samples are those of the values
computed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler

STEPS = 6


def _walk(save, theta, state):
    """``theta`` grown by a tenth at each of ``STEPS`` steps, each value saved (``save=None``: none)."""

    def step(carry, _):
        state, value = carry
        value = value * 1.1
        if save is not None:
            state, _ = save(state, True, {"x": value}, scheduler_state={"value": value}, solver_state=value)
        return (state, value), None

    (state, value), _ = jax.lax.scan(step, (state, theta), jnp.arange(STEPS))
    return value, state


@pytest.mark.parametrize("checkpoint_every", [0, 4])
def test_the_gradient_of_a_function_that_saves_is_that_of_the_function(checkpoint_every, tmp_path):
    init_save, save, postprocess_save = io.save(
        io.MemoryCollector(save_dir=tmp_path), checkpoint_every=checkpoint_every, block_size=2
    )
    state = init_save({"x": jnp.zeros(())}, jnp.zeros(()), scheduler.static_information(samples_collected=STEPS))
    gradient, state = jax.jit(jax.grad(lambda theta, state: _walk(save, theta, state), has_aux=True))(2.0, state)
    expected = jax.grad(lambda theta: _walk(None, theta, None)[0])(2.0)
    np.testing.assert_allclose(gradient, expected)
    np.testing.assert_allclose(postprocess_save(state, None)["samples"]["x"], 2.0 * 1.1 ** np.arange(1, STEPS + 1))
