"""One saving strategy whose ``save`` two compiled programs call, each with a scheduler state (and a sample) of its
own structure: every checkpoint must be taken in the structure of the program that sends it, however many programs
the strategy traced since, and whichever of them runs again from jax's cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import StructureMismatchError
from jaxstow.io.chains import read_checkpoint


def _program(save, sample, scheduler_state):
    """A compiled run of 4 steps from ``start``, saving ``sample(x)`` with ``scheduler_state(x)``, ``x`` the step."""

    def run(state, start):
        def step(state, i):
            x = i.astype(jnp.float32)
            return save(state, True, sample(x), scheduler_state=scheduler_state(x), solver_state=x)[0], None

        return jax.lax.scan(step, state, start + jnp.arange(4))[0]

    return jax.jit(run)


def test_each_program_checkpoints_its_own_scheduler_state_after_another_was_traced(tmp_path):
    init_save, save, postprocess_save = io.save(io.MemoryCollector(save_dir=tmp_path), checkpoint_every=2, block_size=2)
    warm_up = _program(save, lambda x: {"a": x}, lambda x: {"lr": x})
    sampling = _program(save, lambda x: {"a": x}, lambda x: {"temperature": -x})
    information = scheduler.static_information(samples_collected=8)
    for run in range(2):  # the second run's programs come from jax's cache: neither is traced again
        state = jax.block_until_ready(warm_up(init_save({"a": 0.0}, 0.0, information), 0))
        record, _ = read_checkpoint(str(tmp_path / f"chain_{run}.checkpoint.jxs"))
        assert list(record["scheduler_state"]) == ["lr"]
        assert float(record["scheduler_state"]["lr"]) == 3.0
        state = jax.block_until_ready(sampling(state, 4))
        record, _ = read_checkpoint(str(tmp_path / f"chain_{run}.checkpoint.jxs"))
        assert list(record["scheduler_state"]) == ["temperature"]
        assert float(record["scheduler_state"]["temperature"]) == -7.0
        np.testing.assert_array_equal(postprocess_save(state, None)["samples"]["a"], np.arange(8, dtype=np.float32))


def test_a_program_with_other_leaves_runs_again_after_another_was_traced(tmp_path):
    init_save, save, postprocess_save = io.save(io.MemoryCollector(save_dir=tmp_path), checkpoint_every=2, block_size=2)
    two_leaves = _program(save, lambda x: {"a": x, "b": 10 + x}, lambda x: None)
    one_leaf = _program(save, lambda x: {"a": 100 + x}, lambda x: x)
    information = scheduler.static_information(samples_collected=4)
    first = postprocess_save(two_leaves(init_save({"a": 0.0, "b": 0.0}, 0.0, information), 0), None)
    second = postprocess_save(one_leaf(init_save({"a": 0.0}, 0.0, information), 0), None)
    again = postprocess_save(two_leaves(init_save({"a": 0.0, "b": 0.0}, 0.0, information), 0), None)
    steps = np.arange(4, dtype=np.float32)
    for result in (first, again):
        np.testing.assert_array_equal(result["samples"]["a"], steps)
        np.testing.assert_array_equal(result["samples"]["b"], 10 + steps)
    np.testing.assert_array_equal(second["samples"]["a"], 100 + steps)


def test_a_checkpoint_whose_samples_do_not_fit_the_runs_sample_is_refused_naming_the_leaf(tmp_path):
    information = scheduler.static_information(samples_collected=None)
    init_save, save, _ = io.save(io.MemoryCollector(save_dir=tmp_path), checkpoint_every=2, block_size=2)
    state = init_save({"x": jnp.float32(0)}, jnp.float32(0), information)
    for step in range(5):  # checkpointed at steps 2 and 4, then the run stops (its process would die here)
        state = save(state, True, {"x": jnp.float32(step + 0.5)}, solver_state=jnp.float32(step))[0]
    for sample, message in [
        ({"x": jnp.int32(0)}, r"'x': held as float32\[\*\], the run samples int32\[\*\]"),  # was cast to 0, 1, 2, 3
        ({"y": jnp.float32(0)}, r"'y': the run samples float32\[\*\], not held"),  # was a KeyError
    ]:
        init_save, _, _ = io.save(io.MemoryCollector(save_dir=tmp_path), checkpoint_every=2, block_size=2)
        with pytest.raises(StructureMismatchError, match=message):
            init_save(sample, jnp.float32(0), information)
