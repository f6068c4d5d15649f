"""A strategy reused for runs that sample a variable in another dtype (a step counter declared ``0`` in one run and
``0.0`` in the next) leaves chains of both in its file: ArviZ, which stacks the chains of a variable, would turn them
all into one dtype without a word (int32 steps past 2**24 into float32 ones that are not those steps), so the
conversion refuses them, as it refuses chains of other shapes or of other variables, saying to convert each run."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import JaxstowError

if importlib.util.find_spec("arviz") is None:
    pytest.skip("needs ArviZ (pip install 'jaxstow[arviz]')", allow_module_level=True)

FIRST = 2**24 + 1  # an int32 that float32 rounds


def test_chains_whose_draws_of_a_variable_differ_in_dtype_are_refused_naming_both(tmp_path) -> None:
    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path))
    information = scheduler.static_information(samples_collected=4)
    results = []
    for declared in (jnp.int32(0), jnp.float32(0)):
        state = init_save({"step": declared}, None, information)
        steps = jnp.arange(FIRST, FIRST + 4, dtype=declared.dtype)
        run = jax.jit(
            lambda state, steps: jax.lax.scan(lambda s, t: (save(s, True, {"step": t})[0], None), state, steps)
        )
        results.append(postprocess_save(run(state, steps)[0], None))
    assert results[0]["samples"]["step"][0] == FIRST  # each run's draws as it sampled them
    expected = r"'step' has draws of int32 in chain 0 but float32 in chain 1: .* each dtype on their own"
    with pytest.raises(JaxstowError, match=expected):
        io.to_inference_data(path)
    with pytest.raises(JaxstowError, match=expected):
        io.to_inference_data(results)
    one_run = io.to_inference_data(results[0])  # each run on its own
    assert np.asarray(one_run.posterior["step"]).dtype == np.int32


def test_chains_of_runs_of_other_variables_are_refused_saying_to_convert_each_run(tmp_path) -> None:
    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path))
    results = []
    for name in ("theta", "beta"):  # a notebook that samples again, another model
        state = init_save({name: 0.0}, None, scheduler.static_information(samples_collected=3))
        for t in range(3):
            state, _ = save(state, True, {name: float(t)})
        results.append(postprocess_save(state, None))
    expected = r"chain 1 has the variables \['beta'\], but chain 0 has \['theta'\]: .* convert the runs of each on"
    for given in (path, results):
        with pytest.raises(JaxstowError, match=expected):
            io.to_inference_data(given)
    assert list(io.to_inference_data(results[1]).posterior.data_vars) == ["beta"]
