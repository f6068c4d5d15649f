"""A per-process value restored into a template subtree of ``like``: each leaf in the form its like leaf asks for, as
the file's other leaves are (numpy with ``as_numpy=True``, a tensor for a tensor, an array for an array); and a
value at the empty dict key ``""`` told from a tree saved whole as one per-process value."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow


def _saved() -> io.BytesIO:
    buffer = io.BytesIO()
    value = {"pos": np.arange(3, dtype=np.int32), "scale": np.float32(1.5), "epoch": 2}
    jaxstow.save(buffer, {"w": np.ones(2, np.float32), "loader": jaxstow.per_process(value)})
    buffer.seek(0)
    return buffer


def _like(pos, scale):
    return {"w": jax.ShapeDtypeStruct((2,), jnp.float32), "loader": {"pos": pos, "scale": scale, "epoch": 0}}


def test_as_numpy_gives_numpy_arrays_inside_a_per_process_value_too():
    like = _like(jax.ShapeDtypeStruct((3,), jnp.int32), jax.ShapeDtypeStruct((), jnp.float32))
    restored = jaxstow.load(_saved(), like=like, as_numpy=True)
    assert type(restored["w"]) is np.ndarray
    assert type(restored["loader"]["pos"]) is np.ndarray and restored["loader"]["pos"].tolist() == [0, 1, 2]
    assert type(restored["loader"]["scale"]) is np.ndarray and float(restored["loader"]["scale"]) == 1.5
    plain = jaxstow.load(_saved(), like=like)["loader"]
    assert isinstance(plain["pos"], jax.Array) and isinstance(plain["scale"], jax.Array) and plain["epoch"] == 2


def test_a_tensor_or_an_array_of_like_gets_a_tensor_or_an_array():
    torch = pytest.importorskip("torch")
    restored = jaxstow.load(_saved(), like=_like(torch.zeros(3, dtype=torch.int32), np.zeros((), np.float32)))
    assert isinstance(restored["loader"]["pos"], torch.Tensor) and restored["loader"]["pos"].tolist() == [0, 1, 2]
    assert type(restored["loader"]["scale"]) is np.ndarray and restored["loader"]["scale"].shape == ()
    scalar = jaxstow.load(_saved(), like=_like(np.zeros(3, np.int32), np.float32(0)))["loader"]["scale"]
    assert type(scalar) is np.float32 and scalar == 1.5


def test_a_per_process_value_at_the_empty_key_is_not_taken_for_the_whole_tree():
    # {"": per_process(v)} names its value "" as a tree saved as per_process(tree) does: only the structure tells them
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"": jaxstow.per_process({"a": np.arange(2, dtype=np.int32)}), "w": np.full(2, 7.0)})
    for like in ({"": None, "w": np.zeros(2)}, {"": {"a": np.zeros(2, np.int32)}, "w": np.zeros(2)}):
        buffer.seek(0)
        restored = jaxstow.load(buffer, like=like)
        assert restored[""]["a"].tolist() == [0, 1] and restored["w"].tolist() == [7.0, 7.0]
    buffer.seek(0)
    assert jaxstow.load(buffer, like={"w": np.zeros(2)}, partial=True)["w"].tolist() == [7.0, 7.0]
    whole = io.BytesIO()
    jaxstow.save(whole, jaxstow.per_process({"a": np.arange(2, dtype=np.int32), "w": np.full(2, 7.0)}))
    whole.seek(0)
    assert jaxstow.load(whole, like={"a": np.zeros(2, np.int32), "w": np.zeros(2)})["a"].tolist() == [0, 1]
