"""A collector of jax_sgmc's interface, whose ``save(chain_id, values)`` takes one sample at a time, cannot take a
sample back: where a run gives it samples the run did not keep (rows that another call from the same saving state
sent, a checkpointed step that ``vmap`` ran for a chain whose loop or branch did not take it), ``postprocess_save``
raises a ``CollectorError`` saying what to do, rather than returning those samples as the run's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError

UNKNOWN = scheduler.static_information(samples_collected=None)


class _OneSampleAtATime(io.DataCollector):
    """jax_sgmc's interface: each chain's samples in a list, as ``save(chain_id, values)`` gives them."""

    def __init__(self) -> None:
        self.data: list[list[float]] = []

    def register_chain(self, init_sample=None, init_checkpoint=None, static_information=None):
        self.data.append([])
        return len(self.data) - 1

    def register_data_loader(self, data_loader):
        pass

    def save(self, chain_id, values):
        self.data[chain_id].append(float(values[0]))

    def checkpoint(self, chain_id, state):
        pass

    def finalize(self, chain_id):
        pass

    def finished(self, chain_id):
        return self.data[chain_id]

    def resume(self):
        return {}


def test_a_checkpointed_run_gives_every_sample_once_in_order():
    # A checkpoint hands over the samples of a block not yet full, which its block brings again once full.
    init_save, save, postprocess_save = io.save(_OneSampleAtATime(), checkpoint_every=3, block_size=4)
    state = init_save({"x": jnp.float32(0)}, jnp.float32(0), UNKNOWN)
    step = lambda state, t: (save(state, t % 4 != 1, {"x": t}, solver_state=t)[0], None)  # noqa: E731
    result = postprocess_save(jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(23.0))[0])(state), None)
    assert result["samples"] == [float(t) for t in range(23) if t % 4 != 1]


def test_a_second_call_from_one_initial_state_is_refused_not_mixed_with_the_first():
    init_save, save, postprocess_save = io.save(_OneSampleAtATime(), block_size=2)
    state = init_save({"x": jnp.float32(0)}, None, UNKNOWN)

    @jax.jit
    def run(state, offset):
        return jax.lax.scan(lambda state, t: (save(state, True, {"x": t + offset})[0], None), state, jnp.arange(6.0))[0]

    jax.block_until_ready(run(state, 1000.0))  # a warm-up call, whose samples went to the collector
    with pytest.raises(CollectorError, match=r"sample 0 came again with other values.*call init_save for each run"):
        postprocess_save(run(state, 0.0), None)


def test_a_checkpointed_step_of_a_chain_whose_while_loop_ended_is_refused_not_given_as_its_sample():
    init_save, save, postprocess_save = io.save(_OneSampleAtATime(), checkpoint_every=3, block_size=4)
    states = jax.vmap(lambda _: init_save({"x": jnp.float32(0)}, jnp.float32(0), UNKNOWN))(jnp.arange(2))

    def chain(state, steps):
        def body(carry):
            state, i = carry
            x = i.astype(jnp.float32)
            return save(state, True, {"x": x}, solver_state=x)[0], i + 1

        return jax.lax.while_loop(lambda carry: carry[1] < steps, body, (state, 0))[0]

    final = jax.jit(jax.vmap(chain))(states, jnp.array([3, 10]))  # step 3 checkpointed for both, run by chain 1 only
    with pytest.raises(CollectorError, match=r"samples of chain 0 .*\(4 of them, where the run kept 3\).*while_loop"):
        postprocess_save(final, None)


def test_a_checkpointed_save_in_both_branches_of_a_per_chain_cond_is_refused_not_given_the_other_branchs_sample():
    init_save, save, postprocess_save = io.save(_OneSampleAtATime(), checkpoint_every=2, block_size=2)
    states = jax.vmap(lambda _: init_save({"x": jnp.float32(0)}, jnp.float32(0), UNKNOWN))(jnp.arange(2))

    def chain(state, number):
        def step(state, i):
            proposal, current = 100.0 * number + i, -(100.0 * number + i)
            return jax.lax.cond(
                (i + number) % 2 == 0,
                lambda state: save(state, True, {"x": proposal}, solver_state=proposal)[0],
                lambda state: save(state, True, {"x": current}, solver_state=current)[0],
                state,
            ), None

        return jax.lax.scan(step, state, jnp.arange(8.0))[0]

    final = jax.jit(jax.vmap(chain))(states, jnp.arange(2.0))
    with pytest.raises(CollectorError, match=r"came again with other values.* lax\.cond"):
        postprocess_save(final, None)
