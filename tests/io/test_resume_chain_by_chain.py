"""A stopped run of several chains continues one chain per call, as jax_sgmc's users run their chains (``init_save``
outside ``vmap``, a compiled run and ``postprocess_save`` for each chain in turn, with one collector): each call
continues the stopped run's next chain, the others keep their checkpoints for the calls to come, and every chain's
draws are those of a run never stopped. A collector made anew for each chain would continue chain 0 again: refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError

STEPS, EVERY, CHAINS = 24, 4, 3
SAMPLE, SOLVER = {"x": jnp.zeros(2)}, {"x": jnp.zeros(2), "key": jax.random.key(0)}
INFORMATION = scheduler.static_information(samples_collected=STEPS)
KEYS = jax.random.split(jax.random.key(0), CHAINS)


def _strategy(collector: io.DataCollector):
    """``io.save``'s functions for ``collector`` and a compiled run of one chain's state, ``x`` and key."""
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=EVERY, block_size=2)

    def step(carry, t):
        state, x, key = carry
        key, noise = jax.random.split(key)
        x = 0.9 * x + jax.random.normal(noise, x.shape)
        state, _ = save(state, t % 2 == 0, {"x": x}, solver_state={"x": x, "key": key})
        return (state, x, key), None

    def run(state, x, key, steps):
        return jax.lax.scan(step, (state, x, key), steps)[0]

    return init_save, jax.jit(run), postprocess_save


def _stop_a_run_of_three_chains(collector: io.DataCollector) -> None:
    init_save, run, _ = _strategy(collector)
    states = jax.vmap(lambda _: init_save(SAMPLE, SOLVER, INFORMATION))(jnp.arange(CHAINS))
    jax.block_until_ready(jax.vmap(run, in_axes=(0, 0, 0, None))(states, jnp.zeros((CHAINS, 2)), KEYS, jnp.arange(14)))
    collector.close()  # as a kill leaves it: checkpointed at step 12


def _continue_one_chain(strategy, collector: io.DataCollector, chain: int) -> np.ndarray:
    init_save, run, postprocess_save = strategy
    state = init_save(SAMPLE, SOLVER, INFORMATION)
    assert int(state.chain_id) == chain
    x, key = jnp.zeros(2), KEYS[chain]
    if (resumed := collector.resume().get(chain)) is not None:
        x, key = resumed.solver_state["x"], resumed.solver_state["key"]
    state, _, _ = run(state, x, key, jnp.arange(int(state.step), STEPS))
    return np.asarray(postprocess_save(state, None)["samples"]["x"][:])


def _uninterrupted(tmp_path) -> list[np.ndarray]:
    collector = io.MemoryCollector(save_dir=tmp_path / "uninterrupted")
    strategy = _strategy(collector)
    return [_continue_one_chain(strategy, collector, chain) for chain in range(CHAINS)]


def _collectors(tmp_path):
    return {
        "hdf5": (lambda: io.HDF5Collector(tmp_path / "samples.h5"), tmp_path, ["samples.h5"]),
        "memory": (
            lambda: io.MemoryCollector(save_dir=tmp_path / "run"),
            tmp_path / "run",
            [f"chain_{chain}.npz" for chain in range(CHAINS)],
        ),
    }


@pytest.mark.parametrize("kind", ["hdf5", "memory"])
def test_a_stopped_run_of_three_chains_continues_one_chain_per_call(tmp_path, kind) -> None:
    collector, folder, finished = _collectors(tmp_path)[kind]
    _stop_a_run_of_three_chains(collector())
    continuing = collector()
    strategy = _strategy(continuing)
    got = [_continue_one_chain(strategy, continuing, chain) for chain in range(CHAINS)]
    for chain, want in enumerate(_uninterrupted(tmp_path)):
        np.testing.assert_array_equal(got[chain], want)  # every chain, as a run never stopped draws it
    assert sorted(path.name for path in folder.iterdir() if path.is_file()) == finished  # no checkpoint left


@pytest.mark.parametrize("kind", ["hdf5", "memory"])
def test_a_collector_made_anew_for_the_next_chain_is_refused_and_the_first_continues(tmp_path, kind) -> None:
    collector, folder, _ = _collectors(tmp_path)[kind]
    _stop_a_run_of_three_chains(collector())
    continuing = collector()
    strategy = _strategy(continuing)
    got = [_continue_one_chain(strategy, continuing, 0)]
    before = {path.name: path.read_bytes() for path in folder.iterdir() if path.name.endswith(".checkpoint.jxs")}
    anew = collector()
    with pytest.raises(CollectorError, match=r"chains 1, 2, which wait to be continued after it: a collector numbers"):
        _continue_one_chain(_strategy(anew), anew, 1)  # registers chain 0 again: refused, nothing written
    anew.close()
    assert {name: (folder / name).read_bytes() for name in before} == before
    got += [_continue_one_chain(strategy, continuing, chain) for chain in (1, 2)]  # the first collector goes on
    for chain, want in enumerate(_uninterrupted(tmp_path)):
        np.testing.assert_array_equal(got[chain], want)
