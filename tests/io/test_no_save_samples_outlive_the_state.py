"""The samples ``io.no_save``'s ``postprocess_save`` returns, kept while the saving state goes on into another run
given it with ``donate_argnums`` (sampling continued, or run again): a chain that filled its room exactly got the
state's own buffer, which that run deleted (``RuntimeError: Array has been deleted``); now its samples are its own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler

ROOM = 4


@pytest.mark.parametrize("chains", [(), (2,)], ids=["one-chain", "vmapped-chains"])
def test_samples_of_a_full_room_survive_the_state_donated_to_the_next_run(chains) -> None:
    init_save, save, postprocess_save = io.no_save()
    information = scheduler.static_information(samples_collected=ROOM)
    make = lambda _: init_save({"x": jnp.zeros(3)}, None, information)  # noqa: E731
    state = jax.vmap(make)(jnp.arange(chains[0])) if chains else make(None)

    def run(state, first):
        step = lambda s, t: save(s, True, {"x": jnp.full(3, t)})  # noqa: E731
        return jax.lax.scan(step, state, first + jnp.arange(float(ROOM)))[0]

    run = jax.jit(jax.vmap(run, in_axes=(0, None)) if chains else run, donate_argnums=0)
    state = run(state, 0.0)
    results = postprocess_save(state, None)
    run(state, 100.0)  # goes on from the state, which it is given to write into
    for result in results if chains else [results]:
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"])[:, 0], np.arange(float(ROOM)))
