"""Rows that reach the collector but are no samples of the run: a chain whose ``save`` a ``jax.lax.cond`` or
``jax.lax.while_loop`` skips under ``jax.vmap`` (which runs the branch for every chain, blocks sent to the host
included, and keeps its result for some), and a compiled run called twice with one initial saving state.

What ``postprocess_save`` returns, what the HDF5 file keeps (its datasets, ``sample_count``, ``/draws_done``) and what
the readers see must be exactly each chain's samples, as many as its final saving state counts.
"""

from __future__ import annotations

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import CollectorError
from jaxstow.io.hdf5_layout import DRAWS_DONE
from jaxstow.io.live import read_draws

STEPS = 16
STOPS = jnp.array([5, 16])  # chain 0 saves its first 5 steps only, chain 1 all of them


def _collector(kind: str, tmp_path):
    return io.MemoryCollector() if kind == "memory" else io.HDF5Collector(tmp_path / "samples.h5")


def _assert_file_holds(path, expected: list[np.ndarray]) -> None:
    """The finished file holds exactly ``expected`` per chain, for h5py and for every reader of jaxstow's."""
    with h5py.File(path, "r") as file:
        assert list(file[DRAWS_DONE][()]) == [len(draws) for draws in expected]
        for chain, draws in enumerate(expected):
            assert file[f"chain~{chain}"].attrs["sample_count"] == len(draws)
            np.testing.assert_array_equal(file[f"chain~{chain}/x"][()], draws)
    read = read_draws(path)
    assert read.finished and read.done == [len(draws) for draws in expected]
    for chain, draws in enumerate(expected):
        np.testing.assert_array_equal(read.chains[chain]["x"], draws)
    shortest = min(len(draws) for draws in expected)
    posterior = io.to_inference_data(str(path), truncate=True).posterior["x"].values
    np.testing.assert_array_equal(posterior, np.stack([draws[:shortest] for draws in expected]))


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_a_chain_that_cond_keeps_from_saving_gets_no_sample_of_the_other_branch(kind, tmp_path):
    collector = _collector(kind, tmp_path)
    init_save, save, postprocess_save = io.save(collector)
    information = scheduler.static_information(samples_collected=STEPS)  # blocks of 2 rows
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(())}, None, information))(jnp.arange(2))

    def chain(state, stop):
        def step(state, i):
            keep_going = lambda state: save(state, True, {"x": i.astype(jnp.float32)})[0]  # noqa: E731
            return jax.lax.cond(i < stop, keep_going, lambda state: state, state), None

        return jax.lax.scan(step, state, jnp.arange(STEPS))[0]

    results = postprocess_save(jax.jit(jax.vmap(chain))(states, STOPS), None)
    expected = [np.arange(5, dtype=np.float32), np.arange(STEPS, dtype=np.float32)]
    for result, draws in zip(results, expected, strict=True):
        assert int(result["sample_count"]) == len(draws)
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), draws)
    if kind == "hdf5":
        _assert_file_holds(tmp_path / "samples.h5", expected)


@pytest.mark.parametrize("block_size", [None, 1, 3, 4])
@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_a_save_in_both_branches_of_a_per_chain_cond_keeps_the_branch_each_chain_took(kind, block_size, tmp_path):
    # The accept/reject pattern: vmap runs both branches for every chain, and each branch's save fills blocks.
    chains, steps = 3, 40
    init_save, save, postprocess_save = io.save(_collector(kind, tmp_path), block_size=block_size)
    information = scheduler.static_information(samples_collected=steps)
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(())}, None, information))(jnp.arange(chains))
    accepted = jax.random.bernoulli(jax.random.key(0), 0.5, (chains, steps))
    kept = jax.random.bernoulli(jax.random.key(1), 0.8, (chains, steps))  # some draws not kept, chain by chain

    def chain(state, accepted, kept, number):
        def step(state, i):
            proposal, current = (1000 * number + i).astype(jnp.float32), -(1000 * number + i).astype(jnp.float32)
            state = jax.lax.cond(
                accepted[i],
                lambda state: save(state, kept[i], {"x": proposal})[0],
                lambda state: save(state, kept[i], {"x": current})[0],
                state,
            )
            return state, jnp.where(accepted[i], proposal, current)

        return jax.lax.scan(step, state, jnp.arange(steps))

    state, draws = jax.jit(jax.vmap(chain))(states, accepted, kept, jnp.arange(chains))
    results = postprocess_save(state, None)
    expected = [np.asarray(draws[c])[np.asarray(kept[c])] for c in range(chains)]
    for result, draws_kept in zip(results, expected, strict=True):
        assert int(result["sample_count"]) == len(draws_kept)
        np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), draws_kept)
    if kind == "hdf5":
        _assert_file_holds(tmp_path / "samples.h5", expected)


@pytest.mark.parametrize("checkpoint_every", [0, 3])
def test_a_while_loop_that_ends_early_for_one_chain_gives_it_only_its_samples(checkpoint_every, tmp_path):
    init_save, save, postprocess_save = io.save(
        io.MemoryCollector(save_dir=tmp_path), checkpoint_every=checkpoint_every, block_size=4
    )
    information = scheduler.static_information(samples_collected=None)
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(())}, jnp.zeros(()), information))(jnp.arange(2))

    def chain(state, steps):
        def body(carry):
            state, i = carry
            x = i.astype(jnp.float32)
            return save(state, True, {"x": x}, solver_state=x)[0], i + 1

        return jax.lax.while_loop(lambda carry: carry[1] < steps, body, (state, 0))[0]

    results = postprocess_save(jax.jit(jax.vmap(chain))(states, jnp.array([3, 10])), None)
    for result, steps in zip(results, [3, 10], strict=True):
        assert int(result["sample_count"]) == steps
        np.testing.assert_array_equal(result["samples"]["x"], np.arange(steps, dtype=np.float32))
    for chain, steps in enumerate([3, 10]):
        with np.load(tmp_path / f"chain_{chain}.npz") as stored:
            np.testing.assert_array_equal(stored["x"], np.arange(steps, dtype=np.float32))


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_a_run_called_twice_with_one_initial_state_returns_the_second_calls_samples_only(kind, tmp_path):
    init_save, save, postprocess_save = io.save(_collector(kind, tmp_path), block_size=8)
    state = init_save({"x": jnp.zeros(())}, None, scheduler.static_information(samples_collected=None))

    @jax.jit
    def run(state, keep, offset):
        def step(state, i):
            return save(state, keep[i], {"x": i + offset})[0], None

        return jax.lax.scan(step, state, jnp.arange(len(keep)))[0]

    many = np.ones(200, bool)
    few = np.arange(200) % 3 == 0
    jax.block_until_ready(run(state, many, 1000.0))  # a warm-up call, whose 200 samples are not the run's
    result = postprocess_save(run(state, few, 0.0), None)
    expected = np.nonzero(few)[0].astype(np.float32)
    assert int(result["sample_count"]) == len(expected)
    np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), expected)
    if kind == "hdf5":
        _assert_file_holds(tmp_path / "samples.h5", [expected])


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_the_first_of_two_calls_from_one_initial_state_is_refused_not_given_the_seconds_samples(kind, tmp_path):
    # The host keeps each chain's rows as the call that sent them last gave them: the earlier call's final state was
    # given the later call's rows where both sent blocks, silently.
    init_save, save, postprocess_save = io.save(_collector(kind, tmp_path), block_size=2)
    state = init_save({"x": jnp.zeros(())}, None, scheduler.static_information(samples_collected=None))

    @jax.jit
    def run(state, offset):
        return jax.lax.scan(lambda state, i: (save(state, True, {"x": i + offset})[0], None), state, jnp.arange(5.0))[0]

    first = run(state, 0.0)
    jax.block_until_ready(run(state, 100.0))
    with pytest.raises(CollectorError, match=r"another run went on from the same saving state .* call init_save"):
        postprocess_save(first, None)


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_the_longer_of_two_calls_from_one_initial_state_is_refused_not_given_a_mix_of_both(kind, tmp_path):
    # The shorter call, sent after the longer, wrote over the longer's first rows only: its last block (the one row
    # compared before) was untouched, and postprocess_save gave the shorter call's rows followed by the longer's.
    init_save, save, postprocess_save = io.save(_collector(kind, tmp_path), block_size=2)
    state = init_save({"x": jnp.zeros(())}, None, scheduler.static_information(samples_collected=None))

    def run(state, steps, offset):
        scan = jax.lax.scan(lambda state, i: (save(state, True, {"x": i + offset})[0], None), state, jnp.arange(steps))
        return scan[0]

    longer = jax.jit(lambda state: run(state, 12, 1000.0))(state)
    jax.block_until_ready(jax.jit(lambda state: run(state, 5, 0.0))(state))
    with pytest.raises(CollectorError, match=r"samples of chain \d+ from two runs: .* call init_save for each run"):
        postprocess_save(longer, None)


@pytest.mark.parametrize(
    ("block_size", "message"),
    [
        (4, r"holds other samples of chain \d than this run's final state"),  # row 0 in the last block sent
        (2, r"it could be of either"),  # row 0 before it: each chain's state ends as both branches did
    ],
)
@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_branches_that_are_loops_of_their_own_differing_in_their_first_row_are_refused(
    kind, block_size, message, tmp_path
):
    # vmap runs both branches of a per-chain lax.cond for every chain; each branch's loop sent its own blocks, and a
    # full block not sent yet left the first row of the block sent before it uncompared: one chain got the other
    # branch's first sample.
    init_save, save, postprocess_save = io.save(_collector(kind, tmp_path), block_size=block_size)
    information = scheduler.static_information(samples_collected=8)
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(())}, None, information))(jnp.arange(2))
    draws = jnp.arange(8.0)

    def sampler(draws):
        return lambda state: jax.lax.scan(lambda state, x: (save(state, True, {"x": x})[0], None), state, draws)[0]

    branches = jax.vmap(lambda state, take: jax.lax.cond(take, sampler(draws), sampler(draws.at[0].set(100.0)), state))
    final = jax.jit(branches)(states, jnp.array([True, False]))
    with pytest.raises(CollectorError, match=message):
        postprocess_save(final, None)


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_the_first_of_two_calls_is_refused_whatever_the_draws_its_last_block_shares_with_the_second(kind, tmp_path):
    # The state was compared with the host's rows at one sample: two calls of few distinct draws (booleans) whose
    # last samples agreed gave the first call's state the second call's rows.
    init_save, save, postprocess_save = io.save(_collector(kind, tmp_path), block_size=4)
    information = scheduler.static_information(samples_collected=None)
    last_block = np.array([True, False, True, True])

    @jax.jit
    def run(state, head):
        draws = jnp.concatenate([head, jnp.asarray(last_block)])
        return jax.lax.scan(lambda state, draw: (save(state, True, {"x": draw})[0], None), state, draws)[0]

    state = init_save({"x": jnp.zeros((), bool)}, None, information)
    first = run(state, jnp.array([True, True, True, True, False, False]))
    jax.block_until_ready(run(state, jnp.array([False, False, True, False, True, False])))
    with pytest.raises(CollectorError, match=r"the same saving state"):
        postprocess_save(first, None)


def _two_calls(kind, tmp_path, second_draws):
    """A compiled run of 8 draws called twice from one initial state, the second call with ``second_draws``."""
    init_save, save, postprocess_save = io.save(_collector(kind, tmp_path), block_size=2)
    state = init_save({"x": jnp.zeros(())}, None, scheduler.static_information(samples_collected=None))
    run = jax.jit(lambda state, draws: jax.lax.scan(lambda s, x: (save(s, True, {"x": x})[0], None), state, draws)[0])
    first = run(state, jnp.arange(8.0))
    second = jax.block_until_ready(run(state, second_draws))
    return first, second, postprocess_save


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
@pytest.mark.parametrize("which", ["first", "second"])
def test_two_calls_that_differ_only_before_their_last_block_are_refused_whichever_state_is_given(kind, which, tmp_path):
    # Both final states end on the same block, which is all the host could hold a state against: the first call's
    # state was given the second call's rows, with sample 0 of the second call.
    first, second, postprocess_save = _two_calls(kind, tmp_path, jnp.arange(8.0).at[0].set(-999.0))
    with pytest.raises(CollectorError, match=r"another run from the same saving state .* it could be of either"):
        postprocess_save(first if which == "first" else second, None)


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
@pytest.mark.parametrize("which", ["first", "second"])
def test_a_warm_up_call_with_the_same_draws_leaves_either_state_its_samples(kind, which, tmp_path):
    first, second, postprocess_save = _two_calls(kind, tmp_path, jnp.arange(8.0))
    result = postprocess_save(first if which == "first" else second, None)
    np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), np.arange(8.0, dtype=np.float32))
    if kind == "hdf5":
        _assert_file_holds(tmp_path / "samples.h5", [np.arange(8.0, dtype=np.float32)])


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_a_second_call_with_other_draws_throughout_keeps_its_own_and_the_first_is_refused(kind, tmp_path):
    first, second, postprocess_save = _two_calls(kind, tmp_path, jnp.arange(8.0) + 100.0)
    with pytest.raises(CollectorError, match=r"another run went on from the same saving state"):
        postprocess_save(first, None)
    (tmp_path / "again").mkdir()
    first, second, postprocess_save = _two_calls(kind, tmp_path / "again", jnp.arange(8.0) + 100.0)
    result = postprocess_save(second, None)
    np.testing.assert_array_equal(np.asarray(result["samples"]["x"][:]), np.arange(8.0, dtype=np.float32) + 100.0)
