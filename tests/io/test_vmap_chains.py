"""Several chains under ``jax.vmap``, built the ways a user would try: each chain must come back with its own draws,
in order, or the run must fail with an error that shows how to give each chain a saving state of its own.

Each chain of a small random walk draws from its own key and keeps every ``period``-th step, its own period; the
draws the strategies return must be exactly those of the same walk run without saving.
"""

from __future__ import annotations

import functools

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError, CollectorError

CHAINS = 4
STEPS = 24
SAMPLE = {"x": jnp.zeros(2)}
INFORMATION = scheduler.static_information(samples_collected=None)
PERIODS = jnp.array([1, 2, 3, 4])
KEYS = jax.random.split(jax.random.key(0), CHAINS)
SHOWN_WAY = r"jax\.vmap\(lambda _: init_save\(init_sample, init_checkpoint, information\)\)\(jnp\.arange\(chains\)\)"


def _walk(save, saving_state, key, period, x=None, first=0, steps=STEPS):
    """``steps`` steps of a random walk from step ``first`` at ``x`` (the origin by default), saving every
    ``period``-th position (``save=None``: none); returns the saving state, every step's position and the walk's
    state (its key and position)."""

    def step(carry, t):
        state, key, x = carry
        key, noise = jax.random.split(key)
        x = x + jax.random.normal(noise, (2,))
        if save is not None:
            state, _ = save(state, t % period == 0, {"x": x}, solver_state={"key": key, "x": x})
        return (state, key, x), x

    start = (saving_state, key, jnp.zeros(2) if x is None else x)
    (state, key, x), xs = jax.lax.scan(step, start, jnp.arange(first, first + steps))
    return state, xs, {"key": key, "x": x}


def _expected() -> list[np.ndarray]:
    """Each chain's kept draws, from the walk run without saving."""
    _, xs, _ = jax.jit(jax.vmap(functools.partial(_walk, None, None)))(KEYS, PERIODS)
    return [np.asarray(xs[chain])[:: int(PERIODS[chain])] for chain in range(CHAINS)]


def _assert_each_chain_has_its_own_draws(results) -> None:
    expected = _expected()
    assert isinstance(results, list) and len(results) == CHAINS
    assert len({draws[0].tobytes() for draws in expected}) == CHAINS  # the chains' draws differ
    for chain, result in enumerate(results):
        assert int(result["sample_count"]) == len(expected[chain])
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), expected[chain])


def _run(save, states):
    return jax.jit(jax.vmap(functools.partial(_walk, save)))(states, KEYS, PERIODS)[0]


@pytest.fixture(params=["memory", "hdf5-file", "hdf5-path"])
def collector(request, tmp_path):
    if request.param == "memory":
        yield io.MemoryCollector()
    elif request.param == "hdf5-path":
        yield io.HDF5Collector(tmp_path / "samples.h5")
    else:
        with h5py.File(tmp_path / "samples.h5", "w", libver="latest") as file:
            yield io.HDF5Collector(file)


def test_a_vmapped_init_save_gives_each_chain_its_own_state_and_draws(collector) -> None:
    init_save, save, postprocess_save = io.save(collector, block_size=4)
    states = jax.vmap(lambda _: init_save(SAMPLE, None, INFORMATION))(jnp.arange(CHAINS))
    np.testing.assert_array_equal(states.chain_id, np.arange(CHAINS))
    _assert_each_chain_has_its_own_draws(postprocess_save(_run(save, states), None))


def test_init_save_vmapped_over_its_arguments_with_checkpoints(tmp_path) -> None:
    init_save, save, postprocess_save = io.save(io.HDF5Collector(tmp_path / "s.h5"), checkpoint_every=5, block_size=3)
    solver = {"key": KEYS, "x": jnp.zeros((CHAINS, 2))}
    samples = {"x": jnp.zeros((CHAINS, 2))}
    states = jax.vmap(init_save, in_axes=(0, 0, None))(samples, solver, INFORMATION)
    _assert_each_chain_has_its_own_draws(postprocess_save(_run(save, states), None))
    with h5py.File(tmp_path / "s.h5", "r") as file:
        assert list(file["draws_done"][:]) == [len(draws) for draws in _expected()]


@pytest.mark.parametrize("shape", [(2, 2), (1, 4)], ids=["2x2", "1x4"])
def test_init_save_under_nested_vmaps_numbers_the_chains_in_order(shape) -> None:
    init_save, save, postprocess_save = io.save(io.MemoryCollector(), block_size=4)
    states = jax.vmap(jax.vmap(lambda _: init_save(SAMPLE, None, INFORMATION)))(jnp.zeros(shape))
    np.testing.assert_array_equal(states.chain_id, np.arange(CHAINS).reshape(shape))
    walk = functools.partial(_walk, save)
    final, _, _ = jax.jit(jax.vmap(jax.vmap(walk)))(states, KEYS.reshape(shape), PERIODS.reshape(shape))
    _assert_each_chain_has_its_own_draws(postprocess_save(final, None))


def test_init_save_under_jit_of_vmap() -> None:
    init_save, save, postprocess_save = io.save(io.MemoryCollector(), block_size=4)
    states = jax.jit(jax.vmap(lambda _: init_save(SAMPLE, None, INFORMATION)))(jnp.arange(CHAINS))
    _assert_each_chain_has_its_own_draws(postprocess_save(_run(save, states), None))


def test_each_chain_resumes_from_its_own_checkpoint(tmp_path) -> None:
    """A run abandoned after 12 steps, continued by a new strategy whose init_save is vmapped: every chain continues
    from its own checkpoint, and the draws are those of a run never interrupted."""

    def start(folder):
        collector = io.MemoryCollector(save_dir=folder)
        init_save, save, postprocess_save = io.save(collector, checkpoint_every=6, block_size=4)
        solver = {"key": KEYS, "x": jnp.zeros((CHAINS, 2))}
        states = jax.vmap(init_save, in_axes=(None, 0, None))(SAMPLE, solver, INFORMATION)
        return collector, save, postprocess_save, states

    def segment(save, states, solver, first, steps):
        walk = functools.partial(_walk, save, first=first, steps=steps)
        final, _, solver = jax.jit(jax.vmap(walk))(states, solver["key"], PERIODS, solver["x"])
        return final, solver

    _, save, _, states = start(tmp_path)
    jax.block_until_ready(
        segment(save, states, {"key": KEYS, "x": jnp.zeros((CHAINS, 2))}, 0, 12)
    )  # abandoned: no postprocess_save
    collector, save, postprocess_save, states = start(tmp_path)
    resumed = collector.resume()
    assert sorted(resumed) == list(range(CHAINS))
    np.testing.assert_array_equal(states.step, [12] * CHAINS)
    np.testing.assert_array_equal(states.sent, [len(range(0, 12, int(period))) for period in PERIODS])
    solver = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(resumed[chain].solver_state for chain in range(CHAINS)))
    states, _ = segment(save, states, solver, 12, 12)
    _assert_each_chain_has_its_own_draws(postprocess_save(states, None))


def test_one_state_mapped_with_in_axes_none_is_refused_before_the_run(collector) -> None:
    init_save, save, _ = io.save(collector)
    state = init_save(SAMPLE, None, INFORMATION)
    with pytest.raises(ArgumentError, match=rf"must be mapped along with the samples.*{SHOWN_WAY}"):
        jax.jit(jax.vmap(functools.partial(_walk, save), in_axes=(None, 0, 0)))(state, KEYS, PERIODS)


def _copies(init_save):
    state = init_save(SAMPLE, None, INFORMATION)
    return jax.tree.map(lambda leaf: jnp.stack([leaf] * CHAINS), state)


@pytest.mark.parametrize(
    "build",
    [
        _copies,
        lambda init_save: jax.vmap(jax.jit(lambda _: init_save(SAMPLE, None, INFORMATION)))(jnp.arange(CHAINS)),
        lambda init_save: jax.lax.map(lambda _: init_save(SAMPLE, None, INFORMATION), jnp.arange(CHAINS)),
    ],
    ids=["stacked-copies", "vmap-of-jit", "lax-map"],
)
def test_chains_sharing_one_state_fail_and_write_nothing(build, tmp_path) -> None:
    """States that are copies of one (one chain id): a CollectorError that shows the way, and no chain's draws in
    the file, rather than one chain holding the last chain's draws."""
    with h5py.File(tmp_path / "samples.h5", "w", libver="latest") as file:
        init_save, save, postprocess_save = io.save(io.HDF5Collector(file), block_size=4)
        final = _run(save, build(init_save))
        with pytest.raises(CollectorError, match=rf"4 chains write as chain 0.*got none of them.*{SHOWN_WAY}"):
            postprocess_save(final, None)
        assert list(file["draws_done"][:]) == [0] and not file["chain~0/x"][:].any()


@pytest.mark.parametrize("in_axes", [0, None], ids=["vmapped-init", "one-state-in_axes-None"])
def test_no_save_keeps_each_chain_its_own_draws(in_axes) -> None:
    init_save, save, postprocess_save = io.no_save()
    information = scheduler.static_information(samples_collected=STEPS)
    if in_axes == 0:
        states = jax.vmap(lambda _: init_save(SAMPLE, None, information))(jnp.arange(CHAINS))
    else:
        states = init_save(SAMPLE, None, information)
    final = jax.jit(jax.vmap(functools.partial(_walk, save), in_axes=(in_axes, 0, 0)))(states, KEYS, PERIODS)[0]
    _assert_each_chain_has_its_own_draws(postprocess_save(final, None))


@pytest.mark.parametrize("strategy", ["no_save", "save"])
def test_a_state_returned_with_its_chains_moved_by_out_axes_is_refused_not_read_along_another_axis(strategy) -> None:
    init_save, save, postprocess_save = io.save(io.MemoryCollector()) if strategy == "save" else io.no_save()
    information = scheduler.static_information(samples_collected=3)  # fewer than the chains: no count overflows
    chains = 12
    states = jax.vmap(lambda _: init_save({"x": jnp.float32(0)}, None, information))(jnp.arange(chains))

    def run(state, start):  # three kept draws a chain: start, start + 1, start + 2
        return jax.lax.scan(lambda s, x: save(s, True, {"x": x}), state, start + jnp.arange(3.0))[0]

    final = jax.jit(jax.vmap(run, out_axes=-1))(states, 10.0 * jnp.arange(chains))  # the chains' axis now last
    with pytest.raises(ArgumentError, match=r"out_axes other than 0.*jnp\.moveaxis"):
        postprocess_save(final, None)  # else no_save gave chain c the c-th draw of each chain
    moved_back = jax.tree.map(lambda leaf: jnp.moveaxis(leaf, -1, 0), final)
    for chain, result in enumerate(postprocess_save(moved_back, None)):
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"]), 10.0 * chain + np.arange(3.0))


@pytest.mark.parametrize("chains", [2, 3])
def test_no_save_refuses_moved_chains_where_the_room_is_as_long_as_the_chains(chains) -> None:
    """Every shape of the moved state fits either way (room for as many draws as there are chains)."""
    init_save, save, postprocess_save = io.no_save()
    information = scheduler.static_information(samples_collected=chains)
    states = jax.vmap(lambda _: init_save({"x": jnp.float32(0)}, None, information))(jnp.arange(chains))

    def run(state, start):
        return jax.lax.scan(lambda s, x: save(s, True, {"x": x}), state, start + jnp.arange(float(chains)))[0]

    final = jax.jit(jax.vmap(run, out_axes=-1))(states, 10.0 * jnp.arange(chains))
    with pytest.raises(ArgumentError, match=r"out_axes other than 0.*jnp\.moveaxis"):
        postprocess_save(final, None)  # else chain c got the c-th draw of every chain
    moved_back = jax.tree.map(lambda leaf: jnp.moveaxis(leaf, -1, 0), final)
    for chain, result in enumerate(postprocess_save(moved_back, None)):
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"]), 10.0 * chain + np.arange(float(chains)))


def test_a_stacked_state_stepped_outside_vmap_with_stacked_samples_is_refused(collector) -> None:
    init_save, save, _ = io.save(collector, block_size=4)
    states = jax.vmap(lambda _: init_save(SAMPLE, None, INFORMATION))(jnp.arange(CHAINS))
    with pytest.raises(ArgumentError, match=r"leaf 'x' has the shape \[4, 2\], the chains' axes \[4\] .*jax\.vmap"):
        save(states, jnp.ones(CHAINS, bool), {"x": jnp.ones((CHAINS, 2))})
