"""A saving state given to ``jax.vmap`` with some of its arrays mapped and others not (``in_axes`` with ``None`` for
a part of it) is refused with an ``ArgumentError`` saying to map all of it, when the run is traced, rather than
failing inside ``jax.lax.scan`` with jax's error about the types of its carry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError
from jaxstow.io import SavingState

CHAINS = 3


@pytest.mark.parametrize("unmapped", ["chain_id", "counts", "full"])
@pytest.mark.parametrize("checkpoint_every", [0, 2])
def test_a_state_mapped_in_part_is_refused_saying_to_map_all_of_it(unmapped, checkpoint_every, tmp_path):
    init_save, save, _ = io.save(io.MemoryCollector(save_dir=tmp_path), checkpoint_every, block_size=2)
    information = scheduler.static_information(samples_collected=8)
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(2)}, jnp.zeros(()), information))(jnp.arange(CHAINS))
    in_axes = SavingState(**{field: None if field == unmapped else 0 for field in SavingState._fields})

    def chain(state, offset):
        def step(state, t):
            return save(state, True, {"x": jnp.full(2, t + offset)}, solver_state=t)[0], None

        return jax.lax.scan(step, state, jnp.arange(5.0))[0]

    with pytest.raises(ArgumentError, match=r"mapped some of its arrays and not others .* in_axes=0 for all of it"):
        jax.jit(jax.vmap(chain, in_axes=(in_axes, 0)))(states, jnp.arange(CHAINS) * 10.0)
