"""An ``HDF5Collector`` given a relative path keeps to the file it named when it was made: a later run of the same
strategy, after the process changed its working directory, goes on in that file, not in a new one of the same name
elsewhere."""

from __future__ import annotations

import os

import h5py
import jax
import jax.numpy as jnp
import numpy as np

from jaxstow import io, scheduler


def test_a_later_run_after_a_change_of_working_directory_goes_on_in_the_same_file(tmp_path, monkeypatch):
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(first)
    init_save, save, postprocess_save = io.save(io.HDF5Collector("samples.h5"))

    def run(count: int, offset: float) -> np.ndarray:
        state = init_save({"x": jnp.zeros(())}, None, scheduler.static_information(samples_collected=count))
        steps = jnp.arange(count, dtype=jnp.float32) + offset
        state, _ = jax.lax.scan(lambda state, x: (save(state, True, {"x": x})[0], None), state, steps)
        return np.asarray(postprocess_save(state, None)["samples"]["x"])

    np.testing.assert_array_equal(run(5, 0.0), np.arange(5.0))
    monkeypatch.chdir(elsewhere)
    np.testing.assert_array_equal(run(3, 100.0), 100.0 + np.arange(3.0))
    assert os.listdir(elsewhere) == []
    with h5py.File(first / "samples.h5", "r") as file:
        assert sorted(file) == ["chain~0", "chain~1", "draws_done"]
        np.testing.assert_array_equal(file["draws_done"][...], [5, 3])
        np.testing.assert_array_equal(file["chain~1/x"][...], 100.0 + np.arange(3.0))
