"""A ``save`` with ``checkpoint_every`` in both branches of a per-chain ``jax.lax.cond`` under ``jax.vmap``, which runs
both branches for every chain, checkpoints included: each chain keeps the samples of the branch it took.

A checkpoint taken in a branch carries that branch's sample for every chain; the samples that ``postprocess_save``
returns, and those the collector stores, must still be the run's, even where the last block (the one the final state
holds) is the same in both branches.
"""

from __future__ import annotations

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler

CHAINS, STEPS, BRANCHED = 2, 12, 6  # the first 6 steps choose a branch per chain, the last 6 take the second


def _run(collector, checkpoint_every: int) -> tuple[list[dict], np.ndarray]:
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=checkpoint_every, block_size=2)
    information = scheduler.static_information(samples_collected=STEPS)
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(())}, jnp.zeros(()), information))(jnp.arange(CHAINS))

    def chain(state, number):
        def step(state, i):
            accepted = (i < BRANCHED) & ((i + number) % 2 == 0)
            proposal, current = (100 * number + i).astype(jnp.float32), -(100 * number + i).astype(jnp.float32)
            state = jax.lax.cond(
                accepted,
                lambda state: save(state, True, {"x": proposal}, solver_state=proposal)[0],
                lambda state: save(state, True, {"x": current}, solver_state=current)[0],
                state,
            )
            return state, jnp.where(accepted, proposal, current)

        return jax.lax.scan(step, state, jnp.arange(STEPS))

    state, draws = jax.jit(jax.vmap(chain))(states, jnp.arange(CHAINS))
    return postprocess_save(state, None), np.asarray(draws)


@pytest.mark.parametrize("checkpoint_every", [1, 2, 5])
@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_each_chain_keeps_the_samples_of_the_branch_it_took(kind, checkpoint_every, tmp_path):
    path = tmp_path / "samples.h5"
    collector = io.MemoryCollector(save_dir=tmp_path) if kind == "memory" else io.HDF5Collector(path)
    results, draws = _run(collector, checkpoint_every)
    assert draws[0, 0] == 0 and draws[0, 1] == -1 and draws[1, 1] == 101  # both branches taken by each chain
    for result, chain_draws in zip(results, draws, strict=True):
        assert int(result["sample_count"]) == STEPS
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), chain_draws)
    for chain, chain_draws in enumerate(draws):
        if kind == "hdf5":
            with h5py.File(path, "r") as file:
                np.testing.assert_array_equal(file[f"chain~{chain}/x"][()], chain_draws)
        else:
            with np.load(tmp_path / f"chain_{chain}.npz") as stored:
                np.testing.assert_array_equal(stored["x"], chain_draws)
