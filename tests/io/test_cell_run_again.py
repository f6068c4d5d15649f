"""A notebook cell that makes ``io.save`` again, beside a function traced with the save of the first: jax runs its
trace again, calling the first strategy's save with the second's state; each run's samples still reach the collector
of the ``init_save`` that made its state, never another's."""

from __future__ import annotations

import gc

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io
from jaxstow.errors import CollectorError
from jaxstow.io import live, scheduler

N = 40
save = None  # the global that the cell below makes again, as a notebook does


def update(saving_state, value):
    return save(saving_state, True, {"x": value})  # the global save of when jax traced it first


def _cell(collector, start: float, block_size: int = 8):
    """The notebook cell: a strategy made anew, a run of ``update``."""
    global save
    init_save, save, postprocess_save = io.save(collector, block_size=block_size)
    state = init_save({"x": jnp.float32(0)}, None, scheduler.static_information(samples_collected=N))
    final, _ = jax.lax.scan(update, state, start + jnp.arange(N, dtype=jnp.float32))
    return final, postprocess_save


@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_each_run_reaches_its_own_collector(tmp_path, kind):
    def collector(name):
        return io.MemoryCollector() if kind == "memory" else io.HDF5Collector(str(tmp_path / f"{name}.h5"))

    first, post_first = _cell(collector("a"), 0.0)
    second, post_second = _cell(collector("b"), 1000.0)  # update's trace is jax's, with the first strategy's save
    np.testing.assert_array_equal(np.asarray(post_first(first, None)["samples"]["x"][:]), np.arange(N))
    np.testing.assert_array_equal(np.asarray(post_second(second, None)["samples"]["x"][:]), 1000 + np.arange(N))
    if kind == "hdf5":
        for name, start in (("a", 0), ("b", 1000)):
            draws = live.read_draws(str(tmp_path / f"{name}.h5"))
            assert draws.finished and draws.done == [N]
            np.testing.assert_array_equal(draws.chains[0]["x"], start + np.arange(N))
            with h5py.File(tmp_path / f"{name}.h5", "r") as file:
                assert file["chain~0"].attrs["sample_count"] == N


def test_states_of_two_strategies_stacked_into_one_run_are_refused():
    init_a, save_a, post_a = io.save(io.MemoryCollector(), block_size=4)
    init_b, _, _ = io.save(io.MemoryCollector(), block_size=4)
    sample, info = {"x": jnp.float32(0)}, scheduler.static_information(samples_collected=8)
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), init_a(sample, None, info), init_b(sample, None, info))
    run = jax.vmap(lambda state: jax.lax.scan(lambda s, v: save_a(s, True, {"x": v}), state, jnp.arange(8.0))[0])
    final = run(stacked)
    with pytest.raises(CollectorError, match=r"stacked with those of another io\.save"):
        post_a(jax.tree.map(lambda leaf: leaf[0], final), None)


def update_checkpointed(saving_state, value):
    solver = {name: value for name in solver_names}  # the globals of when jax traced it first, as above
    return save(saving_state, True, {"x": value}, solver_state=solver)


solver_names = ("x",)


def _checkpointing_cell(collector, checkpoint_every: int, names: tuple[str, ...] = ("x",)):
    """The notebook cell again, its strategy checkpointing every ``checkpoint_every`` steps (0: never) a solver
    state of the leaves ``names``."""
    global save, solver_names
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=checkpoint_every, block_size=8)
    solver_names = names
    checkpoint = {name: jnp.float32(0) for name in names} if checkpoint_every else None
    state = init_save({"x": jnp.float32(0)}, checkpoint, scheduler.static_information(samples_collected=N))
    final, _ = jax.lax.scan(update_checkpointed, state, jnp.arange(N, dtype=jnp.float32))
    return final, postprocess_save


@pytest.mark.parametrize("every", [(0, 10), (10, 0)], ids=["then-checkpointed", "then-not"])
def test_a_cell_made_again_with_other_checkpoints_is_refused_until_the_function_is_traced_again(every, tmp_path):
    jax.clear_caches()  # a fresh notebook: no trace of update_checkpointed from another test
    first, post_first = _checkpointing_cell(io.HDF5Collector(str(tmp_path / "a.h5")), every[0])
    np.testing.assert_array_equal(np.asarray(post_first(first, None)["samples"]["x"][:]), np.arange(N))
    second, post_second = _checkpointing_cell(io.HDF5Collector(str(tmp_path / "b.h5")), every[1])
    with pytest.raises(CollectorError, match=r"traced with the save of another io\.save.*jax\.clear_caches\(\)"):
        post_second(second, None)  # else b.h5 would hold no checkpoint, or a foreign error would end the run
    jax.clear_caches()
    third, post_third = _checkpointing_cell(io.HDF5Collector(str(tmp_path / "c.h5")), every[1])
    np.testing.assert_array_equal(np.asarray(post_third(third, None)["samples"]["x"][:]), np.arange(N))


def test_a_cell_made_again_with_another_solver_state_is_refused_not_checkpointed_leaf_for_leaf(tmp_path):
    jax.clear_caches()  # a fresh notebook, as above
    first, post_first = _checkpointing_cell(io.HDF5Collector(str(tmp_path / "a.h5")), 10, ("position", "key"))
    post_first(first, None)
    second, post_second = _checkpointing_cell(io.HDF5Collector(str(tmp_path / "b.h5")), 10, ("momentum", "step"))
    with pytest.raises(CollectorError, match=r"traced with the save of another io\.save.*solver state"):
        post_second(second, None)  # else momentum would be checkpointed as key's values, step as position's


def test_a_state_made_before_its_cell_made_io_save_again_is_a_collector_error_saying_to_make_it_again():
    global save
    information = scheduler.static_information(samples_collected=N)
    init_save, save, postprocess_save = io.save(io.MemoryCollector(), block_size=8)  # the cell of io.save
    state = init_save({"x": jnp.float32(0)}, None, information)  # the cell of the state, run once
    init_save, save, postprocess_save = io.save(io.MemoryCollector(), block_size=8)  # the first cell run again
    gc.collect()  # nothing holds the strategy of the state any more
    with pytest.raises(CollectorError, match=r"made by the init_save of an io\.save that is gone.*init_save\(\.\.\.\)"):
        postprocess_save(jax.lax.scan(update, state, jnp.arange(N, dtype=jnp.float32))[0], None)  # not a jax error
    state = init_save({"x": jnp.float32(0)}, None, information)
    final, _ = jax.lax.scan(update, state, jnp.arange(N, dtype=jnp.float32))
    np.testing.assert_array_equal(np.asarray(postprocess_save(final, None)["samples"]["x"]), np.arange(N))
