"""Samples of the dtypes HDF5 lacks (``ml_dtypes``' bfloat16, float8, int4) and of leaves with no element, through an
:class:`~jaxstow.io.HDF5Collector`: every way back to them (``postprocess_save``, ``read_draws``, ``read_stacked``,
``to_inference_data``, a run resumed from its checkpoint) gives the values saved, in the dtype saved."""

from __future__ import annotations

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.io.live import read_draws, read_stacked

STEPS = 6
DTYPES = [jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int4]  # e5m2: of the kind "f" in ml_dtypes


def _run(collector, sample, make, steps=STEPS):
    init_save, save, postprocess_save = io.save(collector)
    state = init_save(sample, None, scheduler.static_information(samples_collected=steps))
    state = jax.jit(
        lambda state: jax.lax.scan(lambda s, i: (save(s, True, make(i))[0], None), state, jnp.arange(steps))
    )(state)[0]
    return postprocess_save(state, None)


def _expected(dtype) -> np.ndarray:
    return np.stack([np.full(2, step, dtype) for step in range(STEPS)])


def _assert_same(got, expected: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got.astype(np.float32), expected.astype(np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: np.dtype(dtype).name)
def test_samples_of_ml_dtypes_come_back_in_their_dtype_from_every_reader(dtype, tmp_path):
    path = tmp_path / "samples.h5"
    result = _run(io.HDF5Collector(path), {"x": jnp.zeros(2, dtype)}, lambda i: {"x": jnp.full(2, i, dtype)})
    expected = _expected(dtype)
    _assert_same(result["samples"]["x"], expected)
    _assert_same(read_draws(path).chains[0]["x"], expected)
    _assert_same(read_stacked(path)["x"][0], expected)
    _assert_same(io.to_inference_data(str(path)).posterior["x"].values[0], expected)
    with h5py.File(path, "r") as file:  # any HDF5 reader sees the bits as unsigned integers, and the dtype named
        assert file["chain~0/x"].attrs["jaxstow_dtype"] == np.dtype(dtype).name
        np.testing.assert_array_equal(file["chain~0/x"][()], expected.view(file["chain~0/x"].dtype))


def test_samples_of_ml_dtypes_come_back_in_their_dtype_from_a_file_given_open(tmp_path):
    with h5py.File(tmp_path / "samples.h5", "w", libver="latest") as file:
        result = _run(
            io.HDF5Collector(file), {"x": jnp.zeros(2, jnp.bfloat16)}, lambda i: {"x": jnp.full(2, i, jnp.bfloat16)}
        )
        _assert_same(result["samples"]["x"], _expected(jnp.bfloat16))
        _assert_same(io.to_inference_data(file).posterior["x"].values[0], _expected(jnp.bfloat16))


def test_a_run_of_bfloat16_samples_resumes_from_its_checkpoint(tmp_path):
    path = tmp_path / "samples.h5"

    def run(steps):
        collector = io.HDF5Collector(path)
        init_save, save, postprocess_save = io.save(collector, checkpoint_every=2, block_size=2)
        state = init_save({"x": jnp.zeros(2, jnp.bfloat16)}, 0.0, scheduler.static_information(samples_collected=6))
        for step in range(int(state.step), steps):
            state, _ = save(state, True, {"x": jnp.full(2, step, jnp.bfloat16)}, solver_state=float(step))
        return collector, state, postprocess_save

    collector, _, _ = run(5)  # checkpointed at step 4, then stopped as a crash would stop it
    collector.close()
    _, state, postprocess_save = run(STEPS)
    _assert_same(postprocess_save(state, None)["samples"]["x"], _expected(jnp.bfloat16))


def test_a_leaf_of_no_element_is_stored_with_its_rows(tmp_path):
    path = tmp_path / "samples.h5"
    sample = {"empty": jnp.zeros((0, 3)), "y": jnp.zeros(())}
    result = _run(io.HDF5Collector(path), sample, lambda i: {"empty": jnp.zeros((0, 3)), "y": i.astype(jnp.float32)})
    assert int(result["sample_count"]) == STEPS
    steps = np.arange(STEPS, dtype=np.float32)
    for samples in (result["samples"], read_draws(path).chains[0]):
        assert np.shape(samples["empty"]) == (STEPS, 0, 3)
        np.testing.assert_array_equal(samples["y"], steps)
    stacked = read_stacked(path)
    assert stacked["empty"].shape == (1, STEPS, 0, 3)
    np.testing.assert_array_equal(stacked["y"], steps[None])
