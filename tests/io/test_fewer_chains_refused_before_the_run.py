"""A stopped run continued with fewer chains than it was started with is refused when the function that runs the
chains is traced, before any step of it is computed: not at its first block, checkpoint or end, after the compute up
to there. Chains registered one by one before the run still make one run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError

STEPS, EVERY = 12, 4
INFORMATION = scheduler.static_information(samples_collected=STEPS)


def _sampler(collector: io.DataCollector, steps_computed: list[int]):
    """``io.save``'s functions, and a jit-compiled run of every chain given that records each step it computes."""
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=EVERY, block_size=2)

    def step(carry, t):
        state, x = carry
        jax.debug.callback(lambda t: steps_computed.append(int(t)), t)
        x = 0.5 * x + t
        return (save(state, True, {"x": x}, solver_state=x)[0], x), None

    run = jax.jit(jax.vmap(lambda state, x, steps: jax.lax.scan(step, (state, x), steps)[0], in_axes=(0, 0, None)))
    return init_save, run, postprocess_save


def _stop_a_run_of_three_chains(collector: io.DataCollector) -> None:
    init_save, run, _ = _sampler(collector, [])
    states = jax.vmap(lambda _: init_save({"x": 0.0}, 0.0, INFORMATION))(jnp.arange(3))
    jax.block_until_ready(run(states, jnp.zeros(3), jnp.arange(6)))  # checkpointed at step 4
    collector.close()  # as a kill leaves it


@pytest.mark.parametrize("kind", ["hdf5", "memory"])
@pytest.mark.parametrize("registered", ["under vmap", "one by one"])
def test_a_stopped_run_continued_with_fewer_chains_is_refused_before_a_step_is_computed(tmp_path, kind, registered):
    def collector() -> io.DataCollector:
        return io.HDF5Collector(tmp_path / "s.h5") if kind == "hdf5" else io.MemoryCollector(save_dir=tmp_path / "s")

    _stop_a_run_of_three_chains(collector())
    steps_computed: list[int] = []
    refused = collector()
    init_save, run, _ = _sampler(refused, steps_computed)
    if registered == "under vmap":
        states = jax.vmap(lambda _: init_save({"x": 0.0}, 0.0, INFORMATION))(jnp.arange(2))
    else:
        chains = [init_save({"x": 0.0}, 0.0, INFORMATION) for _ in range(2)]
        states = jax.tree.map(lambda *leaves: jnp.stack(leaves), *chains)
    expected = r"a run of 3 chains \(0, 1, 2\) that stopped before it finished, and this run continues it with 2"
    with pytest.raises(CollectorError, match=expected):
        jax.block_until_ready(run(states, jnp.zeros(2), jnp.arange(4, STEPS)))
    assert steps_computed == []
    refused.close()


def test_chains_registered_one_by_one_continue_a_stopped_run_together(tmp_path) -> None:
    _stop_a_run_of_three_chains(io.HDF5Collector(tmp_path / "s.h5"))
    steps_computed: list[int] = []
    init_save, run, postprocess_save = _sampler(io.HDF5Collector(tmp_path / "s.h5"), steps_computed)
    chains = [init_save({"x": 0.0}, 0.0, INFORMATION) for _ in range(3)]
    states = jax.tree.map(lambda *leaves: jnp.stack(leaves), *chains)
    x = jnp.stack([chain.step for chain in chains]).astype(jnp.float32)  # any start: only the counts are checked
    results = postprocess_save(run(states, x, jnp.arange(4, STEPS))[0], None)
    assert [int(result["sample_count"]) for result in results] == [STEPS] * 3
    assert steps_computed == list(range(4, STEPS))
