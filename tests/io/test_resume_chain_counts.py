"""A run of several chains under ``vmap`` that stopped before it finished continues only with the chains it was
started with: a run of fewer chains left the others unfinished (their checkpoints dropped, the samples silently
missing), and a run of more started the others from nothing beside chains well on their way."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError

STEPS, EVERY = 24, 4


def _run(collector: io.DataCollector, chains: int, stop: int = STEPS):
    """The chains of docs/sampling.md's example, run (or continued) to step ``stop``; a stop short of the end leaves
    the collector as a kill would."""
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=EVERY, block_size=2)

    def step(carry, t):
        state, x, key = carry
        key, noise = jax.random.split(key)
        x = 0.9 * x + jax.random.normal(noise, x.shape)
        state, _ = save(state, t % 2 == 0, {"x": x}, solver_state={"x": x, "key": key})
        return (state, x, key), None

    def chain(state, x, key, steps):
        return jax.lax.scan(step, (state, x, key), steps)[0]

    sample, solver = {"x": jnp.zeros(2)}, {"x": jnp.zeros(2), "key": jax.random.key(0)}
    information = scheduler.static_information(samples_collected=STEPS)
    states = jax.vmap(lambda _: init_save(sample, solver, information))(jnp.arange(chains))
    x, key = jnp.zeros((chains, 2)), jax.random.split(jax.random.key(0), chains)
    if resumed := collector.resume():
        x, key = (jnp.stack([resumed[c].solver_state[name] for c in range(chains)]) for name in ("x", "key"))
    steps = jnp.arange(int(states.step[0]), stop)
    states, x, key = jax.jit(jax.vmap(chain, in_axes=(0, 0, 0, None)))(states, x, key, steps)
    if stop < STEPS:
        jax.block_until_ready(states)
        collector.close()  # as a kill leaves it
        return None
    return [np.asarray(result["samples"]["x"][:]) for result in postprocess_save(states, None)]


def _collectors(tmp_path):
    return {
        "hdf5": (lambda: io.HDF5Collector(tmp_path / "samples.h5"), [tmp_path / "samples.h5.checkpoint.jxs"]),
        "memory": (
            lambda: io.MemoryCollector(save_dir=tmp_path / "run"),
            [tmp_path / "run" / f"chain_{chain}.checkpoint.jxs" for chain in range(3)],
        ),
    }


@pytest.mark.parametrize("kind", ["hdf5", "memory"])
def test_a_stopped_run_of_three_chains_continued_with_two_is_refused_and_left_to_continue(tmp_path, kind) -> None:
    collector, checkpoints = _collectors(tmp_path)[kind]
    _run(collector(), 3, stop=14)  # checkpointed at step 12
    before = [path.read_bytes() for path in checkpoints]
    expected = r"holds the checkpoints of a run of 3 chains \(0, 1, 2\) that stopped before it finished, and this run"
    refused = collector()
    with pytest.raises(CollectorError, match=expected + r" continues it with 2 chains \(0, 1\): chain 2 would be left"):
        _run(refused, 2)
    refused.close()  # as the process's end would
    assert [path.read_bytes() for path in checkpoints] == before  # every chain's checkpoint kept
    for got, want in zip(
        _run(collector(), 3), _run(io.MemoryCollector(save_dir=tmp_path / "uninterrupted"), 3), strict=True
    ):
        np.testing.assert_array_equal(got, want)  # the three chains continued, as an uninterrupted run's


@pytest.mark.parametrize("kind", ["hdf5", "memory"])
def test_a_stopped_run_of_three_chains_continued_with_four_is_refused_before_anything_is_written(tmp_path, kind):
    collector, checkpoints = _collectors(tmp_path)[kind]
    _run(collector(), 3, stop=14)
    before = [path.read_bytes() for path in checkpoints]
    refused = collector()
    with pytest.raises(CollectorError, match=r"a run of 3 chains \(0, 1, 2\) .*but registers a chain 3 too"):
        _run(refused, 4)
    refused.close()
    assert [path.read_bytes() for path in checkpoints] == before
    assert not (tmp_path / "run" / "chain_3.checkpoint.jxs").exists()
    if kind == "hdf5":
        with io.swmr.open_for_reading(tmp_path / "samples.h5") as file:
            assert "chain~3" not in file and len(file["draws_done"]) == 3
    for got, want in zip(
        _run(collector(), 3), _run(io.MemoryCollector(save_dir=tmp_path / "uninterrupted"), 3), strict=True
    ):
        np.testing.assert_array_equal(got, want)
