"""``samples_collected`` declared far above what a run keeps: an ``HDF5Collector`` makes its datasets no larger than
it can trim quickly (``2**62`` made ``postprocess_save`` spin for ever), a ``MemoryCollector`` that cannot hold them
says so (numpy's ``MemoryError``); and a ``static_information`` of another kind (jax_sgmc's, or one ``_replace`` set)
is checked as ``scheduler.static_information`` checks it."""

from __future__ import annotations

import time

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError


def _run(collector, information, steps: int = 5):
    init_save, save, postprocess_save = io.save(collector)
    state = init_save({"x": jnp.zeros(())}, None, information)

    def step(state, value):
        state, _ = save(state, True, {"x": value})
        return state, None

    state, _ = jax.lax.scan(step, state, jnp.arange(steps, dtype=jnp.float32))
    return postprocess_save(state, None)


def test_an_hdf5_run_declaring_2_to_the_62_samples_ends_with_those_it_kept(tmp_path):
    start = time.monotonic()
    result = _run(io.HDF5Collector(tmp_path / "draws.h5"), scheduler.static_information(samples_collected=2**62))
    assert time.monotonic() - start < 120  # spun at h5py's resize for ever
    np.testing.assert_array_equal(result["samples"]["x"], np.arange(5, dtype=np.float32))
    with h5py.File(tmp_path / "draws.h5", "r") as file:
        assert file["/chain~0/x"].shape == (5,)


def test_more_samples_than_memory_holds_are_an_argument_error_naming_samples_collected():
    with pytest.raises(ArgumentError, match=r"samples_collected=4611686018427387904 samples of 4 bytes each are more"):
        _run(io.MemoryCollector(), scheduler.static_information(samples_collected=2**62))


@pytest.mark.parametrize("count", ["5", 2.5, True])
def test_a_static_information_set_by_replace_is_checked_as_one_made_anew(count):
    information = scheduler.static_information(samples_collected=5)._replace(samples_collected=count)
    with pytest.raises(ArgumentError, match="samples_collected must be an integer"):
        _run(io.MemoryCollector(), information)  # "5" was Python's TypeError of //
