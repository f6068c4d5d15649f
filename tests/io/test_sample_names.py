"""Sample leaves whose names collide where the collectors (dict keys joined by ``/``) or the readers (joined by ``.``)
name them: an :class:`~jaxstow.errors.ArgumentError` naming both leaves, at ``init_save`` where the collector needs the
names, never one leaf silently dropped, nor a bare h5py error."""

from __future__ import annotations

import h5py
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError
from jaxstow.io.live import read_draws

INFORMATION = scheduler.static_information(samples_collected=4)
DOTTED = {"layer.bias": jnp.zeros(()), "layer": {"bias": jnp.zeros(())}}


def _init(collector, sample):
    init_save, _, _ = io.save(collector)
    return init_save(sample, None, INFORMATION)


def test_to_inference_data_refuses_two_leaves_of_one_dotted_name():
    result = {"sample_count": 2, "samples": {"layer.bias": np.zeros(2), "layer": {"bias": np.ones(2)}}}
    with pytest.raises(ArgumentError, match=r"\('layer', 'bias'\) and \('layer\.bias',\) are both named 'layer\.bias'"):
        io.to_inference_data([result])


def test_arviz_refuses_two_variables_one_of_which_spells_the_others_slash():
    pytest.importorskip("arviz")
    result = {"sample_count": 4, "samples": {"g/mu": np.arange(4.0), "g%2Fmu": np.full(4, 100.0)}}
    with pytest.raises(ArgumentError, match=r"'g%2Fmu' and 'g/mu' would both be named 'g%2Fmu' in ArviZ"):
        io.to_datatree([result])  # and by to_inference_data with ArviZ 1.x: never one variable in the other's place


def test_read_draws_refuses_two_datasets_of_one_dotted_name(tmp_path):
    path = tmp_path / "samples.h5"
    with h5py.File(path, "w") as file:
        for name in ("layer.bias", "layer/bias"):
            file[f"chain~0/{name}"] = np.zeros(2)
        file["chain~0"].attrs["sample_count"] = 2
    with pytest.raises(ArgumentError, match=r"are both named 'layer\.bias'"):
        read_draws(path)


@pytest.mark.parametrize(
    ("sample", "problem"),
    [
        (DOTTED, r"\('layer', 'bias'\) and \('layer\.bias',\) are both named 'layer\.bias'"),
        ({"a/b": jnp.zeros(()), "a": {"b": jnp.zeros(())}}, r"\('a', 'b'\) and \('a/b',\) are both named 'a/b'"),
        ({"a": jnp.zeros(()), "a/b": jnp.zeros(())}, r"leaf 'a' would be a dataset .* under 'a/' need a group"),
        ({"a": {"b": jnp.zeros(())}, "a/b/c": jnp.zeros(())}, r"leaf 'a/b' would be a dataset"),
        ({".": jnp.zeros(()), "x": jnp.zeros(())}, r"leaf '\.' has an empty key or the key '\.'"),
        ({"": jnp.zeros(()), "x": jnp.zeros(())}, r"leaf '' has an empty key"),
        ({"a\x00b": jnp.zeros(())}, r"leaf 'a\\x00b' has a key holding a NUL character"),  # HDF5 named it 'a'
    ],
)
def test_the_hdf5_collector_refuses_names_it_cannot_keep_apart_at_init_save(sample, problem, tmp_path):
    with pytest.raises(ArgumentError, match=problem):
        _init(io.HDF5Collector(tmp_path / "samples.h5"), sample)


def test_the_memory_collector_refuses_two_leaves_of_one_name_at_init_save():
    with pytest.raises(ArgumentError, match=r"are both named 'a/b'"):
        _init(io.MemoryCollector(), {"a/b": jnp.zeros(()), "a": {"b": jnp.zeros(())}})


def test_a_sample_of_one_array_keeps_its_one_dataset(tmp_path):
    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path))
    state = init_save(jnp.zeros(()), None, INFORMATION)
    for step in range(4):
        state, _ = save(state, True, jnp.float32(step))
    np.testing.assert_array_equal(postprocess_save(state, None)["samples"], np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(read_draws(path).chains[0][""], np.arange(4, dtype=np.float32))
